"""Requests to the head: paths from the route table, errors read as the
Rust client reads them, and one rule for retrying."""

import socket

import pytest

from trainstate import _contract, _http


def test_paths_fill_the_route_tables_templates():
    assert _http.url_path(_contract.JOIN_RENDEZVOUS, key="torchrun:a.b_c-1") == (
        "/api/train/rendezvous/torchrun:a.b_c-1/join"
    )
    assert _http.url_path(_contract.END_RANK, id="run-1", rank=3) == "/api/train/runs/run-1/ranks/3/end"
    # One parameter is one segment, whatever it holds.
    assert _http.url_path(_contract.GET_RUN, id="a/b c") == "/api/train/runs/a%2Fb%20c"
    with pytest.raises(ValueError, match="missing"):
        _http.url_path(_contract.END_RANK, id="run-1")
    with pytest.raises(ValueError, match="no parameter 'key'"):
        _http.url_path(_contract.GET_RUN, id="run-1", key="k")


def test_retrying_follows_the_error_code_as_in_rust():
    # Rust's ErrorCode::is_retryable: the 503 codes and request_timeout.
    retryable = {code for code, status in _contract.ERROR_STATUS.items() if status == 503} | {"request_timeout"}
    assert _contract.RETRYABLE_ERROR_CODES == retryable
    for code, status in _contract.ERROR_STATUS.items():
        assert _http.HeadError(status, code, "").retryable == (code in retryable), code


def test_answers_that_are_not_the_heads_are_read_by_their_status():
    # A proxy's 502 or 504: the head may be back later.
    assert _http.error_code(502, None) == "unavailable"
    assert _http.HeadError(504, _http.error_code(504, None), "").retryable
    # A 404 of another server: the URL is wrong, not the run missing.
    assert _http.error_code(404, None) == "no_such_route"
    # A code this client does not know, and a 408 of a proxy: never retried blindly.
    assert _http.error_code(503, "from_the_future") == "unavailable"
    assert _http.error_code(408, None) == "internal"
    assert not _http.HeadError(408, "internal", "").retryable
    # The head's own code decides, whatever the status says.
    assert _http.error_code(500, "corrupt") == "corrupt"


def test_the_heads_errors_carry_their_code(head):
    with pytest.raises(_http.HeadError) as missing:
        _http.request(head.url, _contract.GET_RUN, _http.url_path(_contract.GET_RUN, id="no-such-run"), None, None, 5.0)
    assert (missing.value.status, missing.value.code, missing.value.retryable) == (404, "not_found", False)
    with pytest.raises(_http.HeadError) as refused:
        route = _contract.JOIN_RENDEZVOUS
        _http.request(head.url, route, _http.url_path(route, key="k"), {"world_size": 0}, None, 5.0)
    assert refused.value.code == "invalid" and not refused.value.retryable


def test_no_answer_is_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(_http.Unreachable):
            _http.request(f"http://127.0.0.1:{port}", _contract.HEALTH, "/healthz", None, None, 2.0)
