"""What the provider and the cluster agent share about the machine they run on.

- :mod:`.hardware`: the /proc and NVML string readers both hardware reports use.
- :mod:`.sandbox`: ``run_sandboxed`` / ``start_sandboxed`` under bubblewrap (or unshare + setpriv),
  with :mod:`.sandbox_plan` (the spec, the scrubbed environment, the mount plan and argv, pure) and
  :mod:`.sandbox_runners` (one adapter per backend).
- :mod:`.errors`: ``SandboxError``.

It sits below both ``provider`` and ``cluster``, so neither has to import the other for these.
"""
