"""What the manager serves over HTTPS (one port, its managed certificate ``certs``): the
admission webhooks and the conversion (``webhook``), bundle content at ``contentURL``
(``content``)."""
