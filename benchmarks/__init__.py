"""The measuring tools of uniclr-tf (not part of the installed package; run from the repository root).

* ``python -m benchmarks.bench``: the training step's throughput (model only, with augmentation on the host or
  the device, the objective alone); ``torch_peer.py``, ``torch_gpu_peer.py``, ``torch_r50_peer.py``: PyTorch peers.
* ``python -m benchmarks.cli_vs_bench``, ``benchmarks.epoch_gap``: the train CLI against the bench's step,
  and where the time between two epochs goes; ``benchmarks.memory_probe``, ``benchmarks.spmd_collectives``:
  the step's device memory and the collectives XLA compiles into it.
* ``python -m benchmarks.study``: many train runs from a plan (``study/*.plan``), resumable.
* ``speed.sh``, ``scaling.sh``, ``study/reproduce.sh``: the measurements of docs/results/, by phase.
* ``python -m benchmarks.report speed|scaling|study|trace RESULTS``: the one report of all of them.
"""
