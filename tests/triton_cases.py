"""HLO shared by the Triton fusion tests: a layer norm as XLA:GPU's step 2 leaves it, where a block-level
Triton fusion (`%t`, calling `%centre`) centres the rows and the rest are single ops."""

#: The backend config of a block-level Triton fusion with 1x512 output tiles.
TRITON = ('backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton",'
          '"block_level_fusion_config":{"num_warps":"2","output_tiles":[{"sizes":["1","512"]}],"num_ctas":1,'
          '"num_stages":1}}}')

#: The reducer and the centring computation the Triton fusion calls.
COMPUTATIONS = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%centre (p: f32[16,512]) -> f32[16,512] {
  %p = f32[16,512]{1,0} parameter(0)
  %z = f32[] constant(0)
  %sum = f32[16]{0} reduce(%p, %z), dimensions={1}, to_apply=%add
  %inv = f32[] constant(0.001953125)
  %invb = f32[16]{0} broadcast(%inv), dimensions={}
  %mean = f32[16]{0} multiply(%sum, %invb)
  %meanb = f32[16,512]{1,0} broadcast(%mean), dimensions={0}
  ROOT %c = f32[16,512]{1,0} subtract(%p, %meanb)
}
"""


def normalized_rows(source: str) -> str:
    """Entry lines from the Triton fusion `%t` of `source` (a f32[16,512]) to `%norm` (the centred rows over
    their standard deviation) and `%gb` (the f32[512] parameter `%g` broadcast along the rows)."""
    return f"""  %t = f32[16,512]{{1,0}} fusion({source}), kind=kCustom, calls=%centre, {TRITON}
  %sq = f32[16,512]{{1,0}} multiply(%t, %t)
  %zero = f32[] constant(0)
  %var = f32[16]{{0}} reduce(%sq, %zero), dimensions={{1}}, to_apply=%add
  %n = f32[] constant(0.001953125)
  %nb = f32[16]{{0}} broadcast(%n), dimensions={{}}
  %varn = f32[16]{{0}} multiply(%var, %nb)
  %eps = f32[] constant(1e-05)
  %epsb = f32[16]{{0}} broadcast(%eps), dimensions={{}}
  %vare = f32[16]{{0}} add(%varn, %epsb)
  %rs = f32[16]{{0}} rsqrt(%vare)
  %rsb = f32[16,512]{{1,0}} broadcast(%rs), dimensions={{0}}
  %norm = f32[16,512]{{1,0}} multiply(%t, %rsb)
  %gb = f32[16,512]{{1,0}} broadcast(%g), dimensions={{1}}
"""
