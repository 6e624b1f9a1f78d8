"""`mqadmin`, RocketMQ's admin console: `python -m pocketmq.tools.mqadmin <command> ...`.

Like RocketMQ's tools/, every command is a function over an admin API (the client's
ClientAPI), never a second client:

    cli.py        the argparse shell, the command table, `main` (exit codes, one-line errors)
    command.py    what a command is (Command, Opt) and the flag value types
    session.py    AdminSession: an unstarted ClientInstance + its ClientAPI, nameserver
                  order/failover, client errors -> AdminError, shared lookups
    errors.py     AdminError/UsageError, exit codes, transport reasons
    topic.py      updateTopic, deleteTopic, topicList, topicRoute, topicStatus, updateTopicPerm,
                  topicClusterList
    cluster.py    clusterList, haStatus
    controller.py getSyncStateSet, getBrokerEpoch, electMaster (controller mode: etcd)
    stats.py      brokerStatus, statsAll
    broker.py     getBrokerConfig, updateBrokerConfig, cleanExpiredCQ
    namesrv.py    wipeWritePerm, addWritePerm, updateKvConfig, deleteKvConfig, getNamesrvConfig
    consumer.py   consumerProgress, consumerConnection, consumerStatus, producerConnection
    subgroup.py   updateSubGroup, deleteSubGroup
    offset.py     resetOffsetByTime, cloneGroupOffset
    message.py    sendMessage, queryMsgById
    consume.py    consumeMessage
    tables.py     pure text formatting of what the commands print
"""
from pocketmq.tools.mqadmin.cli import main

__all__ = ["main"]
