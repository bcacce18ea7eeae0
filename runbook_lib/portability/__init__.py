"""Will it run there: checks made before anything is measured.

- :mod:`.checkpoint`: a checkpoint inspected without running it (formats, pickled globals,
  tensors) and loaded safely;
- :mod:`.inventory`: the environment a workload runs in, probed and compared (driver, CUDA,
  compute capability, ``/dev/shm``, disk).

docs/reference/portability.md holds the facts these checks rest on.
"""
