"""What the manager follows besides its own objects: the installed objects' health and
drift (``healthwatch``), the runs' results (``runwatch``), health probes (``probes``)."""
