"""hlo: a lossless model of XLA HLO text — shapes, IR, parser, printer, builder, verifier."""

from hlo.attributes import Metadata, PaddingConfig, Raw, ReplicaGroups, Window, WindowDim
from hlo.ir import Computation, Instruction, IrError, Module
from hlo.literal import Literal
from hlo.parser import HloParseError, parse, parse_file
from hlo.shape import DTYPES, DType, Layout, Shape, TupleShape, parse_shape

__all__ = [
    "DTYPES", "DType", "Layout", "Shape", "TupleShape", "parse_shape",
    "Module", "Computation", "Instruction", "IrError", "Literal",
    "Metadata", "PaddingConfig", "Raw", "ReplicaGroups", "Window", "WindowDim",
    "parse", "parse_file", "HloParseError", "verify", "HloVerifyError",
]


def __getattr__(name: str):
    if name in ("verify", "HloVerifyError"):
        from hlo import verifier

        return getattr(verifier, name)
    raise AttributeError(name)
