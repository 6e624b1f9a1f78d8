"""The client's side of SQL92 subscriptions: MessageSelector and what subscribe() records
(the heartbeat's subscription data; no client-side filter, the broker's dialect counts)."""
import pytest

import pocketmq
from pocketmq.client import InvalidArgumentError, MessageSelector
from pocketmq.client.subscription_state import SubscriptionState
from pocketmq.protocol.bodies import ConsumerData


def test_selectors():
    assert MessageSelector.by_sql("a > 5") == ("SQL92", "a > 5")
    assert MessageSelector.by_tag("TagA || TagB") == ("TAG", "TagA || TagB")
    assert MessageSelector.by_tag() == MessageSelector.by_tag("") == MessageSelector.by_tag(None) == ("TAG", "*")
    for bad in ("", "   ", None, 5):
        with pytest.raises(InvalidArgumentError):
            MessageSelector.by_sql(bad)
    with pytest.raises(InvalidArgumentError):
        MessageSelector.by_tag(5)
    assert pocketmq.MessageSelector is MessageSelector


def test_subscribe_with_a_selector_records_sql92_and_no_client_filter():
    ss = SubscriptionState()
    ss.subscribe("T", MessageSelector.by_sql("a > 5 AND region = 'eu'"), 1000)
    sub = ss.subscriptions["T"]
    assert (sub.expression_type, sub.sub_string, sub.sub_version) == ("SQL92", "a > 5 AND region = 'eu'", 1000)
    assert ss.filters["T"] is None
    hb = ConsumerData("G", subscription_data_set=[sub]).to_json()["subscriptionDataSet"][0]
    assert hb["expressionType"] == "SQL92" and hb["subString"] == "a > 5 AND region = 'eu'"
    assert hb["tagsSet"] == [] and hb["codeSet"] == []


def test_the_string_form_and_by_tag_are_the_same_tag_subscription():
    a, b = SubscriptionState(), SubscriptionState()
    a.subscribe("T", "TagA || TagB", 5)
    b.subscribe("T", MessageSelector.by_tag("TagA || TagB"), 5)
    assert a.subscriptions["T"] == b.subscriptions["T"]
    assert a.subscriptions["T"].expression_type == "TAG" and a.subscriptions["T"].tags_set == ["TagA", "TagB"]
    assert a.filters["T"] is not None and b.filters["T"] is not None
    with pytest.raises(InvalidArgumentError):
        SubscriptionState().subscribe("T", 42, 5)
