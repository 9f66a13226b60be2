"""The pass framework: `Pass` and its kinds, the registry, pipelines and their options, and the pattern DSL passes are written with."""
