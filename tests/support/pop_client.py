"""A small POP client over our RemotingClient, as RocketMQ 5's Java client does it
(MQClientAPIImpl.popMessageAsync / processPopResponse / ackMessageAsync /
changeInvisibleTimeAsync): POP_MESSAGE, then each message's extraInfo built from the
response header (ExtraInfoUtil.buildExtraInfo), ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME
with it. Test tooling: the broker's POP engine is checked through it."""
from __future__ import annotations

from dataclasses import dataclass, field

from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import MessageExt, decode_records


@dataclass
class Popped:
    code: int
    remark: str | None
    ext: dict
    messages: list[MessageExt] = field(default_factory=list)
    extra_infos: list[str] = field(default_factory=list)     # per message, as a Java client builds it
    reconsume: list[int] = field(default_factory=list)       # per message: reconsumeTimes as the client sees it


def _parse_info(text: str | None) -> dict[str, str]:
    out = {}
    for one in (text or "").split(";"):
        if one:
            a, b, c = one.split(" ")
            out[f"{a}@{b}"] = c
    return out


class PopClient:
    def __init__(self, client, addr: str, broker_name: str = "broker-a"):
        self.client = client
        self.addr = addr
        self.broker_name = broker_name

    async def call(self, cmd: RemotingCommand, timeout_s: float = 30) -> RemotingCommand:
        return await self.client.invoke(self.addr, cmd, timeout_s)

    async def pop(self, group: str, topic: str, *, queue_id: int = -1, max_nums: int = 32, invisible_ms: int = 2000,
                  poll_ms: int = 0, order: bool = False, attempt_id: str | None = None, exp: str = "*",
                  exp_type: str = "TAG", init_mode: int = 0) -> Popped:
        ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "maxMsgNums": str(max_nums),
               "invisibleTime": str(invisible_ms), "pollTime": str(poll_ms), "bornTime": "0",
               "initMode": str(init_mode), "expType": exp_type, "exp": exp, "order": "true" if order else "false"}
        if attempt_id:
            ext["attemptId"] = attempt_id
        resp = await self.call(RemotingCommand(R.POP_MESSAGE, ext_fields=ext), timeout_s=poll_ms / 1000 + 10)
        e = resp.ext_fields or {}
        out = Popped(resp.code, resp.remark, e)
        if resp.code != C.SUCCESS:
            return out
        out.messages = decode_records(resp.body)
        starts = _parse_info(e.get("startOffsetInfo"))
        orders = {}
        for one in (e.get("orderCountInfo") or "").split(";"):
            if one:
                a, b, c = one.split(" ")
                orders[f"{a}@{b}"] = int(c)
        for m in out.messages:
            retry = "1" if m.topic.startswith("%RETRY%") else "0"
            ck = int(starts[f"{retry}@{m.queue_id}"])
            out.extra_infos.append(" ".join(map(str, (
                ck, e["popTime"], e["invisibleTime"], e["reviveQid"], retry, self.broker_name, m.queue_id,
                m.queue_offset))))
            out.reconsume.append(orders.get(f"{retry}@qo{m.queue_id}%{m.queue_offset}", m.reconsume_times))
        return out

    @staticmethod
    def _place(extra_info: str) -> tuple[str, str]:
        """(queueId, offset) the request header carries: the extraInfo's (0, 0 for junk)."""
        f = extra_info.split(" ")
        return (f[6], f[7]) if len(f) >= 8 else ("0", "0")

    async def ack(self, group: str, topic: str, extra_info: str) -> RemotingCommand:
        qid, offset = self._place(extra_info)
        return await self.call(RemotingCommand(R.ACK_MESSAGE, ext_fields={
            "consumerGroup": group, "topic": topic, "queueId": qid, "extraInfo": extra_info, "offset": offset}))

    async def change(self, group: str, topic: str, extra_info: str, invisible_ms: int) -> tuple[RemotingCommand, str]:
        """(the answer, the new extraInfo a Java client would build from it)"""
        f = extra_info.split(" ")
        qid, offset = self._place(extra_info)
        resp = await self.call(RemotingCommand(R.CHANGE_MESSAGE_INVISIBLETIME, ext_fields={
            "consumerGroup": group, "topic": topic, "queueId": qid, "extraInfo": extra_info, "offset": offset,
            "invisibleTime": str(invisible_ms)}))
        new = extra_info
        if resp.code == C.SUCCESS:
            e = resp.ext_fields
            new = " ".join([f[0], e["popTime"], e["invisibleTime"], e["reviveQid"]] + f[4:8])
        return resp, new
