"""hlo: a lossless model of XLA HLO text — shapes, IR, parser, printer, builder, verifier."""

from hlopt.hlo.attributes import Metadata, PaddingConfig, Raw, ReplicaGroups, Window, WindowDim
from hlopt.hlo.ir import Computation, Instruction, IrError, Module
from hlopt.hlo.literal import Literal
from hlopt.hlo.parser import HloParseError, parse, parse_file
from hlopt.hlo.shape import DTYPES, DType, Layout, Shape, TupleShape, parse_shape

__all__ = [
    "DTYPES", "DType", "Layout", "Shape", "TupleShape", "parse_shape",
    "Module", "Computation", "Instruction", "IrError", "Literal",
    "Metadata", "PaddingConfig", "Raw", "ReplicaGroups", "Window", "WindowDim",
    "parse", "parse_file", "HloParseError", "verify", "HloVerifyError",
]


def __getattr__(name: str):
    if name in ("verify", "HloVerifyError"):
        from hlopt.hlo import verifier

        return getattr(verifier, name)
    raise AttributeError(name)
