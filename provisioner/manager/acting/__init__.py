"""What the manager does about a plan: ``actuate`` (the only writer) pins sources (through
``manager.resolution`` and ``manager.signatures``), asks the nodes to pre-stage
(``prestage``), writes runs, Bundles, status and Events (``events``)."""
