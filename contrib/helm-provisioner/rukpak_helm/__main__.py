"""``python -m rukpak_helm``: the helm provisioner process (see ``rukpak_helm.main``)."""

from rukpak_helm.main import main

raise SystemExit(main())
