"""The ``rukpak`` command line: ``main`` (the parser and exit codes), ``bundle``
(``rukpak bundle build|push|inspect``) and ``apply`` (``rukpak apply|diff|status|uninstall``).
"""
