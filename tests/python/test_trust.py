"""The compile cache's trust boundary with real separate users (tdstore/trust.h; docs/DESIGN.md,
"Trust"): user B never runs a graph user A stored, neither from A's store nor from a store A
wrote into; B's own graphs over A's read-only store come from B's graph cache from the second
run on; a team key both hold makes A's graphs B's."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import tdstore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as other users")

# One compiled step over a store, as each user's training script would run it.
STEP = r"""
import json, sys, torch, tdstore
td = tdstore.open(sys.argv[1], mode=sys.argv[2])

@tdstore.compile(name="trust_step")
def step(td):
    return td["x"] * 2 + td["y"].sum()

out = step(td)
assert torch.equal(out, td["x"] * 2 + td["y"].sum()), "wrong result"
s = step.stats()
print(json.dumps({"loads": s.loads, "compiles": s.compiles, "explain": step.explain()}))
"""

USERS = {"a": ("nobody", "nogroup"), "b": ("daemon", "daemon")}


@pytest.fixture()
def place():
    """A scratch directory every user can reach, with a home per user that only they own."""
    d = tempfile.mkdtemp(prefix="tdstore-trust-")
    os.chmod(d, 0o755)
    homes = {}
    for who, (user, group) in USERS.items():
        home = os.path.join(d, "home-" + who)
        os.makedirs(home, mode=0o700)
        shutil.chown(home, user, group)
        homes[who] = home
    yield d, homes
    shutil.rmtree(d, ignore_errors=True)


def run_as(who, homes, store, mode="r", env=None):
    user, group = USERS[who]
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), HOME=homes[who],
             XDG_CONFIG_HOME=os.path.join(homes[who], "config"),
             XDG_CACHE_HOME=os.path.join(homes[who], "cache"))
    e.pop("TDSTORE_KEY_FILE", None)
    e.update(env or {})
    r = subprocess.run(["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups",
                        sys.executable, "-c", STEP, str(store), mode],
                       capture_output=True, text=True, timeout=600, env=e, cwd=homes[who])
    assert r.returncode == 0, f"as {user}: {r.stdout}{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def make_store(path, owner=None):
    td = tdstore.TensorDict.create(path, batch_size=[4])
    td["x"] = torch.arange(4.0)
    td["y"] = torch.ones(4, 3)
    td.commit()
    del td
    if owner:
        user, group = USERS[owner]
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                shutil.chown(os.path.join(root, n), user, group)
        shutil.chown(path, user, group)
    os.chmod(path, 0o755)
    for root, dirs, files in os.walk(path):
        for n in files:
            os.chmod(os.path.join(root, n), 0o644)
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o755)


@needs_root
def test_b_never_runs_a_graph_a_stored_and_reuses_its_own_from_its_cache(place):
    d, homes = place
    store = os.path.join(d, "a-store")
    make_store(store, owner="a")
    first = run_as("a", homes, store, "r+")
    assert first["compiles"] == 1 and first["loads"] == 0, first
    assert run_as("a", homes, store)["loads"] == 1  # A's own graph, from A's store

    # B reads A's store (not writable by B): A's graph is refused, B's trace goes to B's cache.
    b1 = run_as("b", homes, store)
    assert b1["loads"] == 0 and b1["compiles"] == 1, b1
    assert "which this user does not trust" in b1["explain"], b1["explain"]
    assert "graph stored in this user's graph cache" in b1["explain"], b1["explain"]
    # Second run: 0 traces, B's graph from B's cache.
    b2 = run_as("b", homes, store)
    assert b2["loads"] == 1 and b2["compiles"] == 0, b2
    assert os.path.join(homes["b"], "cache", "tdstore", "graphs") in b2["explain"], b2["explain"]
    # A is not affected by B: A still loads its own graph from its store.
    assert run_as("a", homes, store)["loads"] == 1


@needs_root
def test_b_never_runs_a_graph_a_wrote_into_bs_own_store(place):
    d, homes = place
    store = os.path.join(d, "b-store")
    make_store(store, owner="b")
    # A can write B's catalog (group-writable stores on a shared disk; here: made writable).
    for root, dirs, files in os.walk(store):
        for n in files:
            os.chmod(os.path.join(root, n), 0o666)
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o777)
    a = run_as("a", homes, store)
    assert a["compiles"] == 1
    listed = subprocess.run([os.environ.get("TDSTORE_CLI", "tdstore"), "cache", store, "--json"],
                            capture_output=True, text=True) if shutil.which(
        os.environ.get("TDSTORE_CLI", "tdstore")) else None
    b = run_as("b", homes, store)
    assert b["loads"] == 0 and b["compiles"] == 1, b
    assert "which this user does not trust" in b["explain"], b["explain"]
    # A's record is kept (it is A's), B's graph went to B's cache; each reuses their own.
    assert run_as("b", homes, store)["loads"] == 1
    assert run_as("a", homes, store)["loads"] == 1
    if listed is not None:
        assert listed.returncode == 0, listed.stderr
        assert [g["trust"] for g in json.loads(listed.stdout)] == ["foreign"], listed.stdout


@needs_root
def test_a_team_key_both_hold_shares_graphs(place):
    d, homes = place
    store = os.path.join(d, "team-store")
    make_store(store, owner="a")
    key_id = tdstore_key_file(os.path.join(d, "team.key"))
    for who in USERS:  # each member keeps a private copy of the team key
        copy = os.path.join(homes[who], "team.key")
        shutil.copy(os.path.join(d, "team.key"), copy)
        shutil.chown(copy, *USERS[who])
        os.chmod(copy, 0o600)
    a = run_as("a", homes, store, "r+", {"TDSTORE_KEY_FILE": os.path.join(homes["a"], "team.key")})
    assert a["compiles"] == 1
    b = run_as("b", homes, store, "r", {"TDSTORE_KEY_FILE": os.path.join(homes["b"], "team.key")})
    assert b["loads"] == 1 and b["compiles"] == 0, b
    # Without the team key, B does not run it.
    assert run_as("b", homes, store)["loads"] == 0
    # A team key others may read is refused: A's record under it is not loaded (what B loads
    # now is its own graph from its cache, traced by the run above).
    os.chmod(os.path.join(homes["b"], "team.key"), 0o644)
    loose = run_as("b", homes, store, "r", {"TDSTORE_KEY_FILE": os.path.join(homes["b"], "team.key")})
    assert f"signed by key {key_id}, which this user does not trust" in loose["explain"], loose
    assert os.path.join(homes["b"], "cache") in loose["explain"], loose


def tdstore_key_file(path):
    """A new team key, as `tdstore key --new` writes it."""
    return tdstore.create_key_file(path)


def test_a_function_can_keep_its_graphs_in_the_users_graph_cache():
    """tdstore.compile(store=tdstore.user_graph_cache()): graphs of in-memory dicts persist per
    user, sealed, and the next process loads them."""
    script = r"""
import json, torch, tdstore
td = tdstore.TensorDict({"x": torch.arange(6.0)}, batch_size=[6])
f = tdstore.compile(lambda d: d["x"].exp() - 1, name="in_cache", store=tdstore.user_graph_cache())
assert torch.equal(f(td), td["x"].exp() - 1)
print(json.dumps({"loads": f.stats().loads, "compiles": f.stats().compiles}))
"""
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(home, "c"),
                   XDG_CACHE_HOME=os.path.join(home, "k"), PYTHONPATH=os.pathsep.join(sys.path))
        runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                          capture_output=True, text=True).stdout) for _ in range(2)]
        assert runs == [{"loads": 0, "compiles": 1}, {"loads": 1, "compiles": 0}], runs
        info = subprocess.run([sys.executable, "-c", "import json, tdstore; "
                               "print(json.dumps(tdstore.keyring_info(), default=str))"],
                              env=env, check=True, capture_output=True, text=True).stdout
        info = json.loads(info)
        assert info["graph_cache"] == os.path.join(home, "k", "tdstore", "graphs")
        assert info["keys"][0]["signs"] and info["keys"][0]["path"] == os.path.join(
            home, "c", "tdstore", "key")
