"""Text and Markdown reports: the verdict first, each finding with its evidence, then the details."""

import pytest

from graphaudit.report import FORMATS, render

from support.report_samples import dense, document, earlyexit, featuregate, mudd


def test_every_format_renders_every_sample():
    for parts in (featuregate(), mudd(), earlyexit(), dense()):
        for fmt in FORMATS:
            assert render(document(parts), fmt).strip()
    with pytest.raises(ValueError):
        render(document(dense()), "pdf")


def test_text_puts_the_verdict_first_with_evidence_and_tables():
    text = render(document(mudd()), "text")
    lines = text.splitlines()
    assert lines[0].startswith("graphaudit run · model ")
    verdict_at = lines.index("Verdict")
    assert lines.index("Evidence") > verdict_at
    for label in ("coefficient variation", "functional dependence", "conditional execution", "compute savings"):
        assert any(line.strip().startswith(label) for line in lines[verdict_at:verdict_at + 20])
    assert "[replay] ΔNLL cross_input = +1.9067 nats" in text
    assert "[runtime] every one of 4 blocks ran in full" in text
    for title in ("Static audit (graph)", "Frozen-controller replay (NLL in nats)", "Coefficient variance",
                  "Runtime profile"):
        assert title in lines
    assert max(len(line) for line in lines[:verdict_at + 20]) <= 100
    # per-block times come from profiled runs, slower than the plain ones the latency is from
    assert "median ms (profiled)" in text
    assert "node events cover 97.0% of the profiled runs' time" in text
    assert "block times were taken under the profiler, whose runs took 1.30× the plain runs" in text


def test_text_says_plainly_what_did_not_run():
    text = render(document(dense()), "text")
    assert "note: no coefficient tensors: the frozen replay did not run" in text
    assert "Frozen-controller replay" not in text
    assert "not measured  Not measured: no coefficient tensors were declared," in text


def test_claims_are_shown():
    claim = {"claim": "dynamic-inference", "supported": False, "reason": "refuted: No: every block runs"}
    text = render(document(featuregate(), claims=[claim]), "text")
    assert "claim dynamic-inference: refuted: No: every block runs" in text
    assert "> claim dynamic-inference: refuted" in render(document(featuregate(), claims=[claim]), "markdown")


def test_markdown_is_a_pr_comment():
    md = render(document(earlyexit()), "markdown")
    assert md.startswith("## graphaudit: `fixtures/featuregate/model.onnx`")
    assert "| property" in md and "| conditional execution | **yes**" in md
    assert "<details><summary>Evidence</summary>" in md and "</details>" in md
    assert "### Runtime profile" in md
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    widths = {len(line.split(" | ")) for line in table_lines if "property" in line or "conditional" in line}
    assert len(widths) == 1  # no stray pipe split a verdict row


def test_a_block_whose_flops_leave_compute_out_shows_them_as_a_lower_bound():
    doc = document(featuregate())
    blocks = doc["static"]["blocks"]
    blocks[1]["flops"], blocks[1]["flops_uncounted_nodes"] = 1234, 2
    blocks[0]["flops"], blocks[0]["flops_uncounted_nodes"] = 5678, 0
    for fmt in ("text", "markdown"):
        rows = [line for line in render(doc, fmt).splitlines() if f" {blocks[0]['name']} " in line
                or f" {blocks[1]['name']} " in line]
        assert any("≥ 1,234" in row for row in rows) and not any("≥ 5,678" in row for row in rows), fmt


def test_the_static_note_says_when_skippable_compute_was_not_counted():
    doc = document(featuregate())
    doc["static"]["flops"] = {"total": 1000, "shapes": {"input_ids": [1, 8]}, "skippable_share": 0.0,
                              "skippable_uncounted_nodes": 3}
    text = render(doc, "text")
    assert "1,000 FLOPs at input shapes {'input_ids': [1, 8]}, at least 0.0% where input values can skip or shrink them " \
           "(3 skippable compute nodes of a value-dependent size not counted)" in " ".join(text.split())
    doc["static"]["flops"]["skippable_uncounted_nodes"] = 0
    note = " ".join(render(doc, "text").split()).split("FLOPs at input shapes")[1][:120]
    assert note.startswith(" {'input_ids': [1, 8]}, 0.0% where input values can skip or shrink them") and "not counted" not in note


def test_the_static_note_bounds_the_total_as_the_static_command_does():
    # "at most" with every row of a selection counted, "at least" with compute of unknown size
    # left out, neither with both: the report's note says what `graphaudit static` says
    doc = document(featuregate())
    base = {"total": 1000, "skippable": 200, "shapes": {"input_ids": [1, 8]}, "skippable_share": 0.2}

    def note(**flops):
        doc["static"]["flops"] = {**base, **flops}
        text = " ".join(render(doc, "text").split())
        return text[text.index("data-dependent compute: ") + 28:][:100]

    assert note(every_row_selected_nodes=["a"], unknown_shape_nodes=["a"]).startswith("at most 1,000 FLOPs")
    assert "at most 20.0% where" in note(every_row_selected_nodes=["a"], unknown_shape_nodes=["a"])
    assert note(unknown_shape_nodes=["b"]).startswith("at least 1,000 FLOPs")
    assert ", 20.0% where" in note(unknown_shape_nodes=["b"])
    assert note(every_row_selected_nodes=["a"], unknown_shape_nodes=["a", "b"]).startswith("1,000 FLOPs")
    assert note().startswith("1,000 FLOPs")
    # every row counted, and the least run is the most (experts taking every routed row): one count
    assert note(every_row_selected_nodes=["a"], unknown_shape_nodes=["a"], skippable=0).startswith("1,000 FLOPs")


def test_the_profile_table_says_no_executed_share_for_the_nodes_of_no_block():
    from graphaudit.report.tables import profile_table

    doc = {"profile": {"provider": "CPUExecutionProvider", "latency_ms": {"median": 1.0, "p10": 1.0, "p90": 1.0},
                       "blocks": [{"name": "layers.0", "median_ms": 0.6, "share": 0.6, "executed_fraction": 1.0},
                                  {"name": "(other)", "median_ms": 0.4, "share": 0.4, "executed_fraction": 0.0}]}}
    rows = profile_table(doc).rows
    assert [row[3] for row in rows] == ["100.0%", "—"]  # (other) took 40% of the time: "ran on 0%" would be false
