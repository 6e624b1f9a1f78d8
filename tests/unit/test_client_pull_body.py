"""ClientAPI.pull_message's PULL_BODY mode: the FOUND body handed out undecoded, and
decode_pull_body giving what the decoding modes give (salvage and errors included)."""
from __future__ import annotations

import pytest

from pocketmq.client import errors
from pocketmq.client.api import PULL_BODY, ClientAPI, PullResult, decode_pull_body
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import ResponseCode
from tests.unit.test_client_api import MQ, RecordingTransport, _pull_req, _record, _resp


async def test_body_mode_hands_the_body_out_and_decodes_nothing():
    body = _record(5) + _record(6)
    ext = {"nextBeginOffset": "7", "minOffset": "0", "maxOffset": "9"}
    api = ClientAPI(RecordingTransport(_resp(ResponseCode.SUCCESS, ext, body), _resp(ResponseCode.SUCCESS, ext, body),
                                       _resp(ResponseCode.SUCCESS, ext, body),
                                       _resp(ResponseCode.PULL_NOT_FOUND, {"nextBeginOffset": "5"})))
    r = await api.pull_message(_pull_req(raw=PULL_BODY))
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.records, r.body) == (
        PullResult.FOUND, 7, 0, 9, [], body)
    raw = await api.pull_message(_pull_req(raw=True))
    assert raw.body is None and raw.records == msgcodec.decode_records_raw(body)
    plain = await api.pull_message(_pull_req())
    assert plain.body is None and plain.records == msgcodec.decode_records(body)
    assert decode_pull_body(r.body, MQ, "b:1") == raw.records
    assert decode_pull_body(r.body, MQ, "b:1", raw=False) == plain.records
    empty = await api.pull_message(_pull_req(raw=PULL_BODY))
    assert (empty.status, empty.body, empty.records) == (PullResult.NO_NEW_MSG, None, [])


def test_decode_pull_body_salvages_and_raises_like_pull_message(caplog):
    good, bad = _record(1), bytearray(_record(2))
    bad[-1] = 0xFF              # properties no longer UTF-8: that record is skipped
    assert decode_pull_body(good + bytes(bad), MQ, "b:1") == msgcodec.decode_records_raw(good)
    assert "skipping undecodable message" in caplog.text
    with pytest.raises(errors.BrokerSystemError, match="undecodable pull body"):
        decode_pull_body(good + good[:-5], MQ, "b:1")
