"""``python -m csi.plugin``: the same process as the ``rukpak-csi-plugin`` console script."""

from csi.plugin.main import main

raise SystemExit(main())
