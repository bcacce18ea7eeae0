"""Will it run there: checks made before anything is measured.

- :mod:`.checkpoint`: a checkpoint inspected without running it (formats, pickled globals,
  tensors) and loaded safely;
- :mod:`.gpus`: what a GPU model can run, known before renting it;
- :mod:`.topology`: how the GPUs talk to each other (NVLink, PCIe), NCCL and the process layout;
- :mod:`.inventory`: the environment a workload runs in, probed and compared (driver, CUDA,
  compute capability, ``/dev/shm``, disk).

docs/reference/portability.md holds the facts these checks rest on.
"""
