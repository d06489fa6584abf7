"""The standing provisioner (``worker``): instance runs taken as work by a long-running
pod, no pod per change; the run record it takes them from is ``instance.runrecord``."""
