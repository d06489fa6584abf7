"""The release's SBOM: an SPDX 2.3 JSON document of what each image of the release holds.

Where it sits: ``hack/release/release.sh`` calls it on the merged multi-arch OCI layout
(``ocindex.py merge``). It reads the images themselves, not the build's inputs: each
architecture's layers are streamed once, and the Debian packages (``var/lib/dpkg/status``)
and Python distributions (``*.dist-info/METADATA`` under ``/opt/rukpak``) found in them
become SPDX packages with purls, each CONTAINED by its image, which the index DESCRIBES.
The document's dates come from SOURCE_DATE_EPOCH and its namespace from the index digest,
so the same images give the same bytes.

    python hack/release/sbom.py --version V LAYOUT OUT.spdx.json
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

SITE = re.compile(
    r"^(?:\./)?opt/rukpak/lib/python3\.\d+/site-packages/([^/]+)\.dist-info/METADATA$"
)
DPKG_STATUS = re.compile(r"^(?:\./)?var/lib/dpkg/status$")


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _dpkg(text: str, arch: str) -> dict[str, dict[str, str]]:
    """Installed packages of a dpkg status file: name -> {version, arch, license?}."""
    found = {}
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"(?m)^([A-Za-z-]+): (.*)$", stanza))
        if "Package" in fields and "installed" in fields.get("Status", ""):
            found[fields["Package"]] = {
                "version": fields.get("Version", ""),
                "arch": fields.get("Architecture", arch),
                "source": str(fields.get("Source") or fields["Package"]).split(" ")[0],
            }
    return found


def contents(layout: Path, manifest_digest: str, arch: str) -> dict[str, Any]:
    """Debian packages and Python distributions in the image ``manifest_digest``."""
    manifest = json.loads(_blob(layout, manifest_digest).read_bytes())
    debs: dict[str, dict[str, str]] = {}
    pythons: dict[str, dict[str, str]] = {}
    for layer in manifest["layers"]:
        with tarfile.open(_blob(layout, layer["digest"]), "r|gz") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                if DPKG_STATUS.match(member.name):
                    f = tar.extractfile(member)
                    assert f is not None
                    debs = _dpkg(f.read().decode("utf-8", "replace"), arch)
                elif SITE.match(member.name):
                    f = tar.extractfile(member)
                    assert f is not None
                    meta = email.parser.BytesHeaderParser().parsebytes(f.read())
                    name = str(meta.get("Name", ""))
                    pythons[name.lower()] = {
                        "name": name,
                        "version": str(meta.get("Version", "")),
                        "license": str(meta.get("License-Expression") or ""),
                    }
    return {"debs": debs, "pythons": pythons}


def _spdx_id(*parts: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", "-".join(parts))


def document(layout: Path, *, version: str) -> dict[str, Any]:
    """The SPDX document of the layout's tagged index."""
    top = json.loads((layout / "index.json").read_bytes())["manifests"][0]
    index = json.loads(_blob(layout, top["digest"]).read_bytes())
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    index_id = _spdx_id("image-index")
    packages: list[dict[str, Any]] = [
        {
            "SPDXID": index_id,
            "name": "rukpak-python",
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "checksums": [{"algorithm": "SHA256", "checksumValue": top["digest"][7:]}],
            "primaryPackagePurpose": "CONTAINER",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "Apache-2.0",
            "copyrightText": "NOASSERTION",
        }
    ]
    relationships = [
        {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
         "relatedSpdxElement": index_id},
    ]  # fmt: skip
    for desc in index["manifests"]:
        arch = desc["platform"]["architecture"]
        image_id = _spdx_id("image", arch)
        packages.append({
            "SPDXID": image_id,
            "name": f"rukpak-python linux/{arch}",
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "checksums": [{"algorithm": "SHA256", "checksumValue": desc["digest"][7:]}],
            "primaryPackagePurpose": "CONTAINER",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
        })  # fmt: skip
        relationships.append({"spdxElementId": index_id, "relationshipType": "CONTAINS",
                              "relatedSpdxElement": image_id})  # fmt: skip
        found = contents(layout, desc["digest"], arch)
        for name, deb in sorted(found["debs"].items()):
            purl = f"pkg:deb/debian/{name}@{deb['version']}?arch={deb['arch']}&distro=debian-12"
            pid = _spdx_id("deb", arch, name)
            packages.append({
                "SPDXID": pid, "name": name, "versionInfo": deb["version"],
                "supplier": "Organization: Debian", "downloadLocation": "NOASSERTION",
                "sourceInfo": f"built from the Debian source package {deb['source']}",
                "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER",
                                  "referenceType": "purl", "referenceLocator": purl}],
            })  # fmt: skip
            relationships.append({"spdxElementId": image_id, "relationshipType": "CONTAINS",
                                  "relatedSpdxElement": pid})  # fmt: skip
        for key, dist in sorted(found["pythons"].items()):
            pid = _spdx_id("pypi", arch, key)
            packages.append({
                "SPDXID": pid, "name": dist["name"], "versionInfo": dist["version"],
                "downloadLocation": "NOASSERTION",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": dist["license"] or "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                  "referenceLocator": f"pkg:pypi/{key}@{dist['version']}"}],
            })  # fmt: skip
            relationships.append({"spdxElementId": image_id, "relationshipType": "CONTAINS",
                                  "relatedSpdxElement": pid})  # fmt: skip
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"rukpak-python-{version}",
        "documentNamespace": f"https://rukpak.io/spdx/rukpak-python-{version}-{top['digest'][7:]}",
        "creationInfo": {"created": created, "creators": ["Tool: rukpak hack/release/sbom.py"]},
        "packages": packages,
        "relationships": relationships,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="sbom.py", description=__doc__.split("\n")[0])
    p.add_argument("--version", required=True)
    p.add_argument("layout", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    doc = document(args.layout, version=args.version)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    counts: dict[str, int] = {}
    for pkg in doc["packages"]:
        kind = pkg["SPDXID"].split("-")[1]
        counts[kind] = counts.get(kind, 0) + 1
    print(f"wrote {args.out}: {counts}")


if __name__ == "__main__":
    main()
