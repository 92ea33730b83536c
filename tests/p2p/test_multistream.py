"""multistream-select sans-I/O negotiators: agreement, na fallback, ls, leftovers, limits."""
import pytest

from node.p2p.multistream import (
    DialerNegotiator,
    ListenerNegotiator,
    MultistreamError,
    NoCommonProtocol,
    encode_message,
)


def pump(dialer, listener):
    """Exchange bytes until neither side has anything to send."""
    for _ in range(20):
        a = dialer.data_to_send()
        if a:
            listener.receive_data(a)
        b = listener.data_to_send()
        if b and not dialer.done:
            dialer.receive_data(b)
        if not a and not b:
            return


def test_first_proposal_accepted():
    d, listener = DialerNegotiator(["/echo/1"]), ListenerNegotiator(["/echo/1", "/x"])
    pump(d, listener)
    assert d.protocol == listener.protocol == "/echo/1"


def test_na_then_second_proposal():
    d, listener = DialerNegotiator(["/new/2", "/old/1"]), ListenerNegotiator(["/old/1"])
    pump(d, listener)
    assert d.protocol == listener.protocol == "/old/1"


def test_no_common_protocol():
    d, listener = DialerNegotiator(["/a", "/b"]), ListenerNegotiator(["/c"])
    with pytest.raises(NoCommonProtocol):
        pump(d, listener)


def test_wire_bytes_exact():
    d = DialerNegotiator(["/noise"])
    assert d.data_to_send() == b"\x13/multistream/1.0.0\n\x07/noise\n"


def test_negotiation_fed_byte_by_byte():
    listener = ListenerNegotiator(["/noise"])
    wire = encode_message("/multistream/1.0.0") + encode_message("/noise") + b"NOISE-DATA"
    i = 0
    while not listener.done:
        listener.receive_data(wire[i:i + 1])
        i += 1
    assert listener.protocol == "/noise"
    assert listener.unused + wire[i:] == b"NOISE-DATA"


def test_leftover_in_one_chunk():
    listener = ListenerNegotiator(["/noise"])
    listener.receive_data(encode_message("/multistream/1.0.0") + encode_message("/noise") + b"abc")
    assert listener.unused == b"abc"


def test_ls_lists_protocols():
    listener = ListenerNegotiator(["/a", "/b"])
    listener.data_to_send()
    listener.receive_data(encode_message("/multistream/1.0.0") + encode_message("ls"))
    out = listener.data_to_send()
    assert b"/a\n" in out and b"/b\n" in out and not listener.done


@pytest.mark.parametrize("wire", [
    encode_message("/multistream/2.0.0"),                   # wrong header
    b"\x02ab",                                              # no trailing newline
    b"\x00",                                                # empty message
    b"\xff\xff\x03",                                        # length over the limit
    b"\xff\xff\xff\xff",                                    # runaway varint
    b"\x03\xff\xfe\n",                                      # not UTF-8
])
def test_malformed_input_raises(wire):
    listener = ListenerNegotiator(["/a"])
    with pytest.raises(MultistreamError):
        listener.receive_data(wire)


def test_too_many_proposals():
    listener = ListenerNegotiator(["/a"], max_proposals=3)
    listener.receive_data(encode_message("/multistream/1.0.0"))
    with pytest.raises(MultistreamError):
        listener.receive_data(b"".join(encode_message(f"/x{i}") for i in range(4)))


def test_dialer_rejects_unexpected_reply():
    d = DialerNegotiator(["/a"])
    with pytest.raises(MultistreamError):
        d.receive_data(encode_message("/multistream/1.0.0") + encode_message("/b"))


def test_non_minimal_length_prefix_is_a_multistream_error():
    with pytest.raises(MultistreamError):
        ListenerNegotiator(["/a"]).receive_data(b"\x80\x00")
