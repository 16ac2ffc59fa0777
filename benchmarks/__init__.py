"""Benchmarks of tft-jax, each runnable as `python -m benchmarks.<name>`.

`train_step` (FP32 and QAT train steps on named configurations), `peer`
(side by side with pytorch-forecasting in one process), `attention`,
`fake_quant`, `inference`, `cpu` (the set that `make bench` runs),
`accelerator` (the whole set on the first GPU/TPU, written as JSON) and
`profile_step` (a `jax.profiler` trace of a train step, attributed to modules).
Every script prints a table, or with `--json` one JSON object per
configuration; `benchmarks.common` holds the shared timing helpers.
"""
