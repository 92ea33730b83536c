"""relay/punch_io.py: the one-line error of a punch none of whose tries reached the peer."""
from relay.punch_io import no_path


def test_a_punchs_failures_are_named_once_each_with_their_count():
    errors = ["TimeoutError()"] * 300 + ["ConnectionRefusedError(111, 'refused')", "TimeoutError()"]
    error = no_path("hole punch", errors, "timed out")
    assert isinstance(error, ConnectionError)
    assert str(error) == "hole punch found no path: TimeoutError() x301; ConnectionRefusedError(111, 'refused')"
    assert str(no_path("quic punch", [], "nothing to try")) == "quic punch found no path: nothing to try"
