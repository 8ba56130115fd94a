"""The provider daemon: offers, heartbeats and jobs run in a separate training process.

Import from the submodules (``provider.agent``, ``provider.hardware``, ``provider.process``):
this package is also the parent of the training process's entry point, which must
not pay for the networking and signing imports.
"""
