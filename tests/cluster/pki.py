"""Certificates and keys for the local control plane, made with the openssl CLI (EC P-256: fast to generate)."""

from __future__ import annotations

import subprocess
from pathlib import Path

APISERVER_SANS = (
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
    "IP:127.0.0.1",
    "IP:10.96.0.1",
)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def _key(name: str, cwd: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=cwd)


def _signed_cert(name: str, subject: str, cwd: Path, *, sans: tuple[str, ...] = (), server: bool = False) -> None:
    _key(name, cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    ext = cwd / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    lines.append("extendedKeyUsage=" + ("serverAuth,clientAuth" if server else "clientAuth"))
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "365", "-sha256", "-extfile", ext.name, "-out", f"{name}.crt", cwd=cwd,
    )


def make_pki(pki: Path, extra_sans: tuple[str, ...] = ()) -> None:
    """Create the CA, the apiserver serving cert, the admin client cert and the service-account key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "admin.crt").exists():
        return
    _key("ca", pki)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=ddpjob-local-ca", "-days", "365", "-sha256",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", "ca.crt", cwd=pki,
    )
    _signed_cert("apiserver", "/CN=kube-apiserver", pki, sans=APISERVER_SANS + extra_sans, server=True)
    _signed_cert("admin", "/O=system:masters/CN=kubernetes-admin", pki)
    _key("sa", pki)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def serving_cert(pki: Path, name: str, sans: tuple[str, ...]) -> tuple[Path, Path]:
    """(cert, key) of a serving certificate from the cluster CA, for a server the apiserver calls (a webhook):
    made once per cluster directory, like make_pki's."""
    if not (pki / f"{name}.crt").exists():
        _signed_cert(name, f"/CN={name}", pki, sans=sans, server=True)
    return pki / f"{name}.crt", pki / f"{name}.key"


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    """An admin kubeconfig with absolute paths to the certs (so it works from any directory)."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: ddpjob-local
  cluster:
    server: {server}
    certificate-authority: {pki / 'ca.crt'}
users:
- name: admin
  user:
    client-certificate: {pki / 'admin.crt'}
    client-key: {pki / 'admin.key'}
contexts:
- name: ddpjob-local
  context: {{cluster: ddpjob-local, user: admin}}
current-context: ddpjob-local
"""
    )
