"""An ``https://`` head: a script reports to it through the CA in
``TRAINSTATE_CA_CERT``, and without it is told which variable to set."""

import subprocess
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from conftest import LEASE, Head, child_env, run_script, script

WORK = """
    import trainstate
    trainstate.init(timeout=1.0)
    print("training", flush=True)
"""


def make_pki(dir: Path) -> Tuple[str, str, str]:
    """A CA and a server certificate it signed for 127.0.0.1 (openssl):
    (CA certificate, server certificate, server key), PEM files."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=dir)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=trainstate test CA", "-days", "2")
    openssl("req", *ec, "-keyout", "head.key", "-out", "head.csr", "-subj", "/CN=127.0.0.1")
    (dir / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", "head.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "head.pem", "-days", "2", "-extfile", "san.ext",
    )
    return str(dir / "ca.pem"), str(dir / "head.pem"), str(dir / "head.key")


@pytest.fixture(scope="module")
def tls_head(tmp_path_factory) -> Iterator[Tuple[Head, str]]:
    ca, cert, key = make_pki(tmp_path_factory.mktemp("pki"))
    head = Head(["--lease", LEASE, "--tls-cert", cert, "--tls-key", key], ca_cert=ca)
    assert head.url.startswith("https://"), head.url
    yield head, ca
    head.stop()


def test_a_script_reports_to_an_https_head_through_trainstate_ca_cert(tls_head, name, tmp_path):
    head, ca = tls_head
    result = run_script(script(tmp_path, WORK), child_env(head.url, name, TRAINSTATE_CA_CERT=ca))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    run = head.run_named(name, "FINISHED")
    assert run["workers"][0]["status"] == "DEAD"


def test_without_the_ca_the_script_trains_and_is_told_to_set_trainstate_ca_cert(tls_head, name, tmp_path):
    head, _ = tls_head
    result = run_script(script(tmp_path, WORK), child_env(head.url, name))
    assert result.returncode == 0, result.stderr
    assert "training" in result.stdout
    assert "not trusted" in result.stderr and "TRAINSTATE_CA_CERT" in result.stderr, result.stderr
    assert head.runs_named(name) == []


def test_a_ca_for_an_http_url_or_an_unusable_ca_is_named_and_nothing_is_reported(tls_head, head, name, tmp_path):
    tls, ca = tls_head
    cases = [(head, ca, "not https://"), (tls, str(tmp_path / "missing.pem"), "TRAINSTATE_CA_CERT=")]
    for target, ca_cert, expected in cases:
        result = run_script(script(tmp_path, WORK), child_env(target.url, name, TRAINSTATE_CA_CERT=ca_cert))
        assert result.returncode == 0, result.stderr
        assert expected in result.stderr and "TRAINSTATE_CA_CERT" in result.stderr, result.stderr
        assert target.runs_named(name) == []
