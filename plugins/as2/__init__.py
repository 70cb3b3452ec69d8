"""AS2 (RFC 4130) for b2bhub: profiles and certificates, receiving, sending, MDNs.

pyas2lib does the MIME, S/MIME and MDN work. It pins oscrypto 1.3.0, which cannot read
the version of OpenSSL 3.0.10 and newer; b2bhub installs the fixed code of the
``elements-oscrypto`` distribution in its place (README "AS2 and oscrypto"). Importing
this package checks that the oscrypto found is one that works, and says how to mend an
environment where it is not.
"""

from __future__ import annotations


def _check_oscrypto() -> None:
    try:
        import oscrypto.asymmetric  # noqa: F401  (loads the OpenSSL backend)
    except Exception as exc:  # LibraryNotFoundError: "Error detecting the version ..."
        raise RuntimeError(
            f"oscrypto cannot load OpenSSL ({exc}); the oscrypto 1.3.0 release cannot "
            "read OpenSSL 3.0.10+ versions. Install the fixed code: "
            "pip install ./packaging/oscrypto (or: pip install --force-reinstall "
            "--no-deps elements-oscrypto==1.4.0b1)") from exc


_check_oscrypto()
