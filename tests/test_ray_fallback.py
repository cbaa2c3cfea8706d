"""The sharded replay's fallback (`cluster._replay_all`): where the rewritten frozen graph fails its
parity check on any shard, every shard is replayed with the graph as exported, as one process
would have, each carrying the note that says why. Ray's actors are stood in for by a pool that
records what each shard was asked to run; the whole sharded replay runs on Ray in test_ray.py."""

from types import SimpleNamespace

from graphaudit.replay.cluster import _replay_all

NOTE = "the rewritten graph did not reproduce the live outputs: replayed as exported"


class _Pool:
    """Two shards; the `failing` shard's replay of the rewritten graph comes back with a note."""

    def __init__(self, failing: int | None):
        self.failing, self.rounds = failing, []

    def reporter(self, k):
        return None

    def crash_after(self, k):
        return None

    def run(self, label, submit, total, progress):
        asked = []
        worker = SimpleNamespace(replay=SimpleNamespace(remote=lambda *args: asked.append(args[4])))
        for k in range(2):
            submit(k, worker)
        self.rounds.append(asked)
        return [SimpleNamespace(settings={"rewrite_note": NOTE} if rewritten and k == self.failing else {})
                for k, rewritten in enumerate(asked)]


FIRST = SimpleNamespace(task="task", tolerance=1e-4)


def test_a_shard_whose_rewrite_fails_sends_every_shard_back_to_the_exported_graph():
    pool = _Pool(failing=1)
    replayed = _replay_all(pool, ("calibration", "evaluation"), FIRST, True, 4, None)
    assert pool.rounds == [[True, True], [False, False]]
    assert [r.settings["rewrite_note"] for r in replayed] == [NOTE, NOTE]


def test_rewrites_that_hold_everywhere_are_replayed_once():
    pool = _Pool(failing=None)
    replayed = _replay_all(pool, ("calibration", "evaluation"), FIRST, True, 4, None)
    assert pool.rounds == [[True, True]]
    assert all("rewrite_note" not in r.settings for r in replayed)


def test_without_rewrites_the_exported_graph_is_replayed_once():
    pool = _Pool(failing=0)  # a note can only come from a rewritten graph: none is asked for
    _replay_all(pool, ("calibration", "evaluation"), FIRST, False, 4, None)
    assert pool.rounds == [[False, False]]
