"""Benchmarks of tft-jax, each command runnable as `python -m benchmarks.<name>`.

Commands (each has `--help`):

* `train_step`: FP32 and QAT train steps on named configurations;
* `peer`: side by side with pytorch-forecasting in one process;
* `attention`: `TemporalSelfAttention` forward+backward, default and flash paths;
* `fake_quant`: `fake_quantize` throughput and the QAT/FP32 step ratio;
* `inference`: the FP32 and int8 forward;
* `optimizer`: the flat-vector optimizer against optax's per-leaf one;
* `dropout_keys`: inline Threefry dropout draws against JAX's rolled loops;
* `selection_variants`: the chunked variable selection against earlier layouts;
* `profile_step`: a `jax.profiler` trace of a train step, attributed to modules;
* `data_pipeline`: time and memory of each stage of `prepare_dataset`;
* `quality`: forecast quality of the defaults on public tables (backtests);
* `cpu`: the set that `make bench` runs;
* `accelerator`: the whole set on the first GPU/TPU, written as JSON;
* `device_check`: one time-boxed run of device tests and benchmarks on a lent GPU/TPU.

Every benchmark prints a table, or with `--json` one JSON object per
configuration (`quality` and `device_check` always print JSON lines).

Library modules, with no command line (`python -m` runs them and prints
nothing): `common` (the shared timing, record and flag helpers), `tables`
(the public tables the forecast-quality benchmark fits) and `backend_probe`
(JAX's default backend, probed in a child process).
"""
