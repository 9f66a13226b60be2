"""HLO pieces shared by the fusion passes' structure tests."""

#: The f32 sum reducer the tests' reductions call.
SUM = """%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""


def entry_module(body: str, params: str, result: str, extra: str = "") -> str:
    """A module `t` with `%sum` (and the computations in `extra`) and an entry `%main(params) -> result` whose
    instruction lines are `body`."""
    return f"HloModule t\n\n{SUM}{extra}\nENTRY %main ({params}) -> {result} {{\n{body}\n}}\n"
