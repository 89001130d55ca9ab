"""tpar.torch through the CPU shared-memory backend, in real rank processes (gloo group for
the rendezvous), with torch CPU tensors. Each test starts its own processes."""

import pytest

from ranks import run_ranks

# A short bound on every wait, so that the error tests finish in seconds.
TIMEOUT_MS = 3000
ERR_ENV = {"TPAR_TIMEOUT_MS": str(TIMEOUT_MS)}
# The library's bound on a wait when TPAR_TIMEOUT_MS is not set (README): a rank that
# ignored the setting would wait this long.
DEFAULT_TIMEOUT_S = 30.0
# Every error must reach every rank within the configured timeout. The bound sits halfway to
# the default: a rank that waited the default fails it, and a loaded 2-core machine has
# 13 s of slack (a bound of the timeout plus 3 s raced there).
ERR_BOUND_S = (TIMEOUT_MS / 1000 + DEFAULT_TIMEOUT_S) / 2

ODD_SIZES = [1, 3, 7, 8, 17, 255, 1001, 4099, 65537]


def ok_records(recs):
    for r in recs:
        assert not r.get("hung"), f"rank {r['rank']} hung:\n{r['output']}"
        assert r.get("ok"), f"rank {r['rank']} failed: {r.get('error_type')}: {r.get('message')}\n{r['output']}"
    return [r["result"] for r in recs]


@pytest.mark.parametrize(
    "world,algo,shm",
    [
        (2, "auto", None),
        (3, "auto", None),
        (4, "oneshot-pull", None),
        (3, "twoshot-push", None),
        (2, "twoshot-pull", "262144"),  # a 256 KiB workspace: the 65537-element calls run in chunks
    ],
)
def test_every_dtype_odd_sizes_bitwise(world, algo, shm):
    env = {"TPAR_ALGO": algo}
    if shm:
        env["TPAR_SHM_BYTES"] = shm
    res = ok_records(run_ranks(world, "correctness", env=env, sizes=ODD_SIZES, dtypes=["float32", "float16", "bfloat16"]))
    for r in res:
        assert r["cases"] == len(ODD_SIZES) * 3 * 3
        assert r["wrong"] == 0, res
    assert len({r["digest"] for r in res}) == 1, "ranks' outputs differ"
    if algo != "auto":
        assert res[0]["algos"] == [algo]


# Bad input is refused before any communication. The scenario proves it by order, not by
# time: each bad call is made while every other rank is parked in a gloo barrier, so a bad
# call that entered the collective would find no peer and end in TparTimeoutError, not in
# InvalidArgumentError (a wall-clock bound of 0.5 s raced on 2 busy cores).
@pytest.mark.parametrize("kind", ["noncontiguous", "int32", "device", "out_size"])
def test_bad_input_on_every_rank_raises_and_leaves_it_usable(kind):
    res = ok_records(run_ranks(2, "bad_input", env=ERR_ENV, kind=kind, who="all"))
    for r in res:
        assert r["first"]["type"] == "InvalidArgumentError", r
        assert "invalid argument" in r["first"]["message"]
        assert r["good_call_after"] is True


@pytest.mark.parametrize("kind", ["noncontiguous", "int32"])
def test_bad_input_on_one_rank_raises_on_every_rank(kind):
    res = ok_records(run_ranks(2, "bad_input", env=ERR_ENV, kind=kind, who="1"))
    assert res[1]["first"]["type"] == "InvalidArgumentError", res[1]
    # Rank 0 calls after rank 1 raised and waits for a peer that never calls: it must raise,
    # within the timeout.
    assert res[0]["first"]["type"] in ("TparTimeoutError", "PeerDiedError", "AbortedError"), res[0]
    assert res[0]["first"]["seconds"] < ERR_BOUND_S, res[0]


def test_sizes_that_differ_across_ranks_raise_mismatch_on_every_rank():
    res = ok_records(run_ranks(3, "mismatch", env=ERR_ENV))
    for r in res:
        assert r["type"] in ("MismatchError", "AbortedError"), res
        assert r["seconds"] < ERR_BOUND_S, res
    assert any(r["type"] == "MismatchError" and "disagrees" in r["message"] for r in res), res


# fork_child: the liveness lock is shared with a child the rank forked (compile workers,
# engine helpers); the rank's own exit must still end the others' calls, not their timeout.
@pytest.mark.parametrize("fork_child", [False, True], ids=["plain", "forked_child_lives_on"])
def test_a_dead_rank_raises_on_every_other_rank(fork_child):
    recs = run_ranks(3, "dead_rank", env=ERR_ENV, fork_child=fork_child)
    assert recs[2].get("returncode") == 3, recs[2]
    res = ok_records(recs[:2])
    for r in res:
        assert r["type"] in ("PeerDiedError", "AbortedError", "PoisonedError"), res
        assert r["seconds"] < ERR_BOUND_S, res
    assert any(r["type"] == "PeerDiedError" and "rank 2" in r["message"] for r in res), res


@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_and_reduce_scatter_bitwise(world):
    sizes = [1, 8, 17, 1001, 4099]
    res = ok_records(run_ranks(world, "gather_scatter", sizes=sizes, dtypes=["float32", "float16", "bfloat16"]))
    for r in res:
        assert r["cases"] == len(sizes) * 3 * 2
        assert r["wrong"] == 0, res
        # Every call went through tpar's CPU backend: 2 collectives + 1 all-reduce per case, then
        # the ops: the all-gather eager and compiled, the reduce-scatter.
        assert r["served"] == len(sizes) * 3 * 3 + 3, res
        assert r["ops"] == {"all_gather_shape": [3 * world, 8], "all_gather": True, "compiled": True, "reduce_scatter": True}, res
        assert r["plan"] == "oneshot-push", res


def test_a_rank_calling_another_collective_raises_mismatch_on_every_rank():
    res = ok_records(run_ranks(3, "collective_mismatch", env=ERR_ENV))
    for r in res:
        assert r["type"] in ("MismatchError", "AbortedError"), res
        assert r["seconds"] < ERR_BOUND_S, res
    assert any(r["type"] == "MismatchError" and "collective" in r["message"] for r in res), res


def test_custom_op_eager_and_compiled():
    for r in ok_records(run_ranks(2, "custom_op")):
        assert r == {"eager": True, "compiled": True}


def test_engine_dropin_contract_on_cpu_ranks():
    for r in ok_records(run_ranks(2, "dropin")):
        assert r == {
            "disabled": False,
            "original_disabled": False,
            "should_fp16": True,
            "should_int32": False,
            "should_strided": False,
            "should_too_big": False,
            "custom_all_reduce": True,
            "input_untouched": True,
            "in_capture": True,
            "all_reduce_out": True,
            "closed_disabled": True,
        }
