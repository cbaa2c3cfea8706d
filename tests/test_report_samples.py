"""The hand-written sub-reports of tests/support/report_samples.py make whole documents."""

from support.report_samples import dense, document, earlyexit, featuregate, mudd


def test_samples_are_shaped_like_the_parts():
    for parts in (featuregate(), mudd(), earlyexit(), dense()):
        doc = document(parts)
        assert set(doc["verdict"]) == {"coefficient_variation", "functional_dependence",
                                       "conditional_execution", "compute_savings"}
