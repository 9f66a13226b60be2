"""Mesh-axes replica groups (`replica_groups=mesh['x'=2,'y'=4] {'y'}`), as newer JAX/XLA print them:
lossless round trip through XLA's parser, groups equal to what XLA CPU runs, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.hlo.attributes import ReplicaGroups
from test_roundtrip import assert_roundtrip

from hlopt import hlo, runtime


def _module(groups: str) -> str:
    return f"""HloModule m, replica_count=8

add {{
  lhs = f32[] parameter(0)
  rhs = f32[] parameter(1)
  ROOT add = f32[] add(lhs, rhs)
}}

ENTRY e {{
  p = f32[] parameter(0)
  rid = u32[] replica-id()
  c = f32[] convert(rid)
  x = f32[] multiply(c, p)
  ROOT ar = f32[] all-reduce(x), channel_id=1, replica_groups={groups}, to_apply=add
}}
"""


ITOA_MESHES = [
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("mesh['a'=2,'b'=4] {'a'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("mesh['a'=2,'b'=4] {'b':(2)2}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("mesh['a'=2,'b'=4] {'a','b':(1)2}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("mesh['a'=8] {'a':(2)2,'a':(1)2}", [[0, 4, 2, 6], [1, 5, 3, 7]]),
    ("mesh['a'=2,'b'=2,'c'=2] {'c','a'}", [[0, 1, 4, 5], [2, 3, 6, 7]]),
]


@pytest.mark.parametrize("text,groups", ITOA_MESHES, ids=[t for t, _ in ITOA_MESHES])
def test_mesh_groups_round_trip_and_run_as_on_xla(text: str, groups: list[list[int]]) -> None:
    module = assert_roundtrip(_module(text))
    rg = module.entry.root.attrs["replica_groups"]
    assert isinstance(rg, ReplicaGroups) and rg.mesh == text and rg.to_text() == text
    assert rg.groups() == groups
    # XLA runs it: every device gets the sum of the replica ids in its group.
    (out,) = runtime.execute(module, [np.ones((8,), np.float32)])
    expected = [0.0] * 8
    for group in groups:
        for device in group:
            expected[device] = float(sum(group))
    assert np.asarray(out).reshape(-1).tolist() == expected


def test_device_ids_are_part_of_the_value() -> None:
    text = "mesh['a'=2,'b'=4], device_ids=(0,2,4,6,1,3,5,7) {'a'}"
    module = assert_roundtrip(_module(text))
    rg = module.entry.root.attrs["replica_groups"]
    assert rg.mesh == text and module.entry.root.attrs["to_apply"].name == "add"
    assert "device_ids" not in module.entry.root.attrs
    # Device array [[0,2,4,6],[1,3,5,7]] (a x b); grouping over 'a' pairs each column (XLA's source semantics).
    assert rg.groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_iota_device_ids_as_xla_prints_them() -> None:
    # XLA's SPMD partitioner on a (4, 2) mesh prints its device order as an iota reshaped and transposed.
    text = "mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)) {'b'}"
    module = assert_roundtrip(_module(text))
    rg = module.entry.root.attrs["replica_groups"]
    assert rg.mesh == text
    # Device array [0,2,4,6,1,3,5,7] reshaped (a=2) x (b=4): grouping over 'b' takes each row.
    assert rg.groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(hlo.HloParseError, match="must reshape"):
        hlo.parse(_module("mesh['a'=2,'b'=4], device_ids=([4,3]T(1,0)) {'b'}"))


def test_verifier_and_passes_read_mesh_groups() -> None:
    module = hlo.parse(_module("mesh['a'=2,'b'=4] {'b'}"))
    hlo.verify(module)
    from hlopt.cost_model import get_cost_model

    assert get_cost_model("h100").node_time_us(module.entry.root) > 0


@pytest.mark.parametrize("bad,message", [
    ("mesh['a'=2,'b'=4] {'c'}", "not a mesh axis"),
    ("mesh['a'=2,'a'=4] {'a'}", "distinct names"),
    ("mesh['a'=2,'b'=4] {'b':(3)2}", "does not divide"),
    ("mesh['a'=2,'b'=4], device_ids=(0,1,2,3) {'a'}", "permutation"),
    ("mesh['a'=2] 'a'", "expected mesh"),
])
def test_bad_mesh_groups_are_clear_errors(bad: str, message: str) -> None:
    with pytest.raises(hlo.HloParseError, match=message) as info:
        hlo.parse(_module(bad))
    assert ":14:63:" in str(info.value)  # the value, on the all-reduce line
