"""A change's one wire form (change.py): every typed change comes back from its wire form as itself, and a
request from the socket or a request file that is not one is refused with a usage error naming the field,
never a crash or a change made of nonsense."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muse_launch.change import (
    KINDS,
    AddInstance,
    Adopt,
    RemoveInstance,
    RestartInstance,
    ScaleRole,
    describe,
    from_wire,
    to_wire,
)
from muse_launch.errors import UsageError

names = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)
text = st.text(max_size=40)
drain = st.none() | st.floats(min_value=0, max_value=86400, allow_nan=False)
env = st.dictionaries(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text().filter(lambda v: "\0" not in v)
)

changes = st.one_of(
    st.builds(AddInstance, names, text, st.booleans(), st.booleans()),
    st.builds(RemoveInstance, names, text, drain, st.booleans(), st.booleans()),
    st.builds(RestartInstance, names, text, st.booleans(), drain, st.booleans()),
    st.builds(ScaleRole, names, st.integers(1, 256), text, drain, st.booleans()),
    st.builds(
        Adopt,
        text.filter(bool),
        st.lists(text, max_size=4).map(tuple),
        env.map(lambda e: tuple(sorted(e.items()))),
        st.none(),
        st.none() | st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    ),
)


@settings(deadline=None)  # a loaded machine; the property is what is tested
@given(changes)
def test_every_change_comes_back_from_its_wire_form_as_itself(change):
    op, args = to_wire(change)
    assert op in KINDS
    wire = json.loads(json.dumps({"op": op, "args": args}))  # as the socket and a request file carry it
    assert all(isinstance(v, str | int | float | bool) for v in wire["args"].values())
    assert from_wire(wire["op"], wire["args"]) == change


def test_what_is_not_said_on_the_wire_is_the_default():
    assert to_wire(AddInstance("decode")) == ("add", {"role": "decode"})
    assert to_wire(ScaleRole("decode", 3, drain_timeout=5)) == (
        "scale",
        {"role": "decode", "replicas": 3, "drain_timeout": 5},
    )


@pytest.mark.parametrize(
    "op, args, says",
    [
        ("drop", {}, "op must be one of add, remove, restart, scale, adopt"),
        ("add", {}, "add: which role?"),
        ("add", {"role": 7}, "add: which role?"),
        ("remove", {"instance": ""}, "remove: which instance?"),
        (
            "restart",
            {"instance": "decode", "drain_timeout": -1},
            "--drain-timeout must be between 0 and 86400",
        ),
        ("remove", {"instance": "decode", "drain_timeout": True}, "--drain-timeout must be between"),
        ("remove", {"instance": "decode", "drain_timeout": 1e9}, "--drain-timeout must be between"),
        ("scale", {"role": "decode", "replicas": 0}, "scale decode: replicas must be a whole number from 1"),
        ("scale", {"role": "decode", "replicas": 2.5}, "replicas must be a whole number"),
        ("scale", {"role": "decode", "replicas": True}, "replicas must be a whole number"),
        ("scale", {"role": "decode", "replicas": 257}, "replicas must be a whole number"),
        ("add", {"role": "decode", "why": 3}, "add: why must be text"),
        ("adopt", {}, "adopt: which file?"),
        ("adopt", {"file": "f.yaml", "sets": "[1]"}, "--set values must be a list of strings"),
        ("adopt", {"file": "f.yaml", "sets": "not json"}, "--set values must be a list of strings"),
        ("adopt", {"file": "f.yaml", "env": '{"1BAD": "x"}'}, "the environment must map"),
        ("adopt", {"file": "f.yaml", "env": '{"A": "a\\u0000b"}'}, "the environment must map"),
        ("adopt", {"file": "f.yaml", "env_sha256": "[]"}, "the environment's digests must map"),
        ("adopt", {"file": "f.yaml", "sha256": 12}, "adopt: sha256 must be text"),
    ],
)
def test_a_request_that_is_not_a_change_is_refused_naming_the_field(op, args, says):
    with pytest.raises(UsageError) as refused:
        from_wire(op, args)
    assert says in str(refused.value)


def test_a_change_is_described_in_words():
    assert (
        describe(RestartInstance("prefill-0", why="restart prefill")) == "restart prefill-0 (restart prefill)"
    )
    assert describe(ScaleRole("decode", 3)) == "scale decode"
    assert describe(ScaleRole("decode", 3, why="scale decode 1 -> 3")) == "scale decode 1 -> 3"
    assert describe(Adopt("f.yaml")) == "up of an edited file"
