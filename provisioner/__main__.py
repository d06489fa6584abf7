"""Entry point of the ``rukpak-provisioner`` console script (the manager).

The manager (Bundle and BundleDeployment controllers, see DESIGN.md) is not
built yet; until it is, this says so and exits 1 so that nothing mistakes it
for a running controller.
"""

from __future__ import annotations

import sys


def main() -> int:
    print(
        "rukpak-provisioner: the manager is not built yet; "
        "use `rukpak bundle ...` to build and push bundles",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
