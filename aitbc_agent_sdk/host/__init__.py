"""What the provider and the cluster agent share about the machine they run on.

- :mod:`._hardware`: the /proc and NVML string readers both hardware reports use.
- :mod:`._sandbox`: ``run_sandboxed`` / ``start_sandboxed`` under bubblewrap (or unshare + setpriv),
  with :mod:`._sandbox_plan` (the spec, the scrubbed environment, the mount plan and argv, pure) and
  :mod:`._sandbox_runners` (one adapter per backend).
- :mod:`._errors`: ``SandboxError``.

It sits below both ``provider`` and ``cluster``, so neither has to import the other for these.
"""
