'use strict';
/*
 * Drive the ali-ons push consumer (npm ali-ons, the Node.js RocketMQ 4.x client) for pocketmq's
 * interop tests, the way cpp_agent.py drives the C++ client: one JSON object per line on stdout.
 *
 *   node ons_agent.js push --ns ADDR --group G --topic T [--stop-file PATH] [--gate-file PATH]
 *        [--seconds 60] [--pull-threshold N] [--poll-ns-ms MS] [--rebalance-ms MS] [--persist-ms MS]
 *        [--instance NAME]
 *        (--poll-ns-ms, --rebalance-ms, --persist-ms: ali-ons' pollNameServerInteval (30 s),
 *        rebalanceInterval (10 s), persistConsumerOffsetInterval (5 s); its defaults unless given)
 *   node ons_agent.js produce --ns ADDR --group G --topic T --count N [--prefix P]
 *        (one Producer#send after the other, bodies "<prefix>-<i>", ali-ons' default options)
 *
 * Events:
 *   {"event": "started"}                       the consumer is initialised (route, heartbeat, rebalance done)
 *   {"event": "pull", "addr", "queue_id", "offset", "t"}        a pull request is sent to broker `addr`
 *   {"event": "pulled", "addr", "queue_id", "offset", "status", "found", "next", "suggest", "t"}
 *   {"event": "pull_error", "addr", "queue_id", "error", "t"}
 *   {"event": "offset_commit", "addr", "topic", "queue_id", "offset", "t"}   UPDATE_CONSUMER_OFFSET (oneway)
 *   {"event": "msg", "topic", "body", "queue_id", "queue_offset", "msg_id", "reconsume_times", "t"}
 *   {"event": "error", "error"}                 the consumer's 'error' events (pull failures etc.)
 *   {"event": "done", "count"}
 *   produce: {"event": "sent", "idx", "status", "msg_id", "broker", "queue_id", "offset", "t0", "t1"} per send
 *            (status: ali-ons' sendStatus, e.g. "SEND_OK", "SLAVE_NOT_AVAILABLE"), or
 *            {"event": "error", "idx", "error", "t0", "t1"} when it throws; then "done" (a failing close:
 *            "close_error" before it)
 *
 * --gate-file: while PATH exists the message handler waits (checked every 5 ms) before it records
 * a message: the consumer holds what it pulled and stops pulling once a queue caches more than
 * --pull-threshold messages (ali-ons' pullThresholdForQueue, default 500). `t` is wall-clock
 * seconds. No ACL: ali-ons signs requests only when given an accessKey.
 */
const fs = require('fs');
const { Consumer, Producer, Message } = require('ali-ons');

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function now() {
  return Date.now() / 1000;
}

function parseArgs(argv) {
  const args = { cmd: argv[0], seconds: 60, stopFile: '', gateFile: '', pullThreshold: 500, pollNsMs: 30000,
    instance: '', count: 1, prefix: 'm', rebalanceMs: 10000, persistMs: 5000 };
  const names = { '--ns': 'ns', '--group': 'group', '--topic': 'topic', '--stop-file': 'stopFile',
    '--gate-file': 'gateFile', '--seconds': 'seconds', '--pull-threshold': 'pullThreshold',
    '--poll-ns-ms': 'pollNsMs', '--instance': 'instance', '--count': 'count', '--prefix': 'prefix',
    '--rebalance-ms': 'rebalanceMs', '--persist-ms': 'persistMs' };
  for (let i = 1; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (!key) throw new Error(`unknown option ${argv[i]}`);
    args[key] = argv[i + 1];
  }
  for (const k of [ 'seconds', 'pullThreshold', 'pollNsMs', 'count', 'rebalanceMs', 'persistMs' ]) {
    args[k] = Number(args[k]);
  }
  if (![ 'push', 'produce' ].includes(args.cmd) || !args.ns || !args.group || !args.topic) {
    throw new Error('usage: ons_agent.js push|produce --ns ADDR --group G --topic T [options]');
  }
  return args;
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
const quiet = { info() {}, debug() {}, warn() {}, error() {} };

async function push(args) {
  const options = {
    httpclient: {}, // only used to look up Aliyun's nameserver list (onsAddr); nameSrv is given
    nameSrv: args.ns,
    consumerGroup: args.group,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    pullThresholdForQueue: args.pullThreshold,
    pollNameServerInteval: args.pollNsMs,
    rebalanceInterval: args.rebalanceMs,
    persistConsumerOffsetInterval: args.persistMs,
    logger: quiet,
  };
  if (args.instance) options.instanceName = args.instance;
  const consumer = new Consumer(options);
  consumer.on('error', err => emit({ event: 'error', error: String(err && err.message || err), t: now() }));

  // what the client asks of which broker: wrap its API object (the instance's remoting client)
  const api = consumer._mqClient;
  const pullMessage = api.pullMessage.bind(api);
  api.pullMessage = async (addr, header, timeout) => {
    emit({ event: 'pull', addr, queue_id: Number(header.queueId), offset: Number(header.queueOffset), t: now() });
    try {
      const r = await pullMessage(addr, header, timeout);
      emit({ event: 'pulled', addr, queue_id: Number(header.queueId), offset: Number(header.queueOffset),
        status: r.pullStatus, found: (r.msgFoundList || []).length, next: Number(r.nextBeginOffset),
        suggest: Number(r.suggestWhichBrokerId), t: now() });
      return r;
    } catch (err) {
      emit({ event: 'pull_error', addr, queue_id: Number(header.queueId), error: String(err && err.message || err),
        t: now() });
      throw err;
    }
  };
  const updateOffset = api.updateConsumerOffsetOneway && api.updateConsumerOffsetOneway.bind(api);
  if (updateOffset) {
    api.updateConsumerOffsetOneway = async (addr, header, ...rest) => {
      emit({ event: 'offset_commit', addr, topic: header.topic, queue_id: Number(header.queueId),
        offset: Number(header.commitOffset), t: now() });
      return updateOffset(addr, header, ...rest);
    };
  }

  let count = 0;
  consumer.subscribe(args.topic, '*', async msg => {
    while (args.gateFile && fs.existsSync(args.gateFile)) await sleep(5);
    count += 1;
    emit({ event: 'msg', topic: msg.topic, body: msg.body.toString(), queue_id: msg.queueId,
      queue_offset: Number(msg.queueOffset), msg_id: msg.msgId, reconsume_times: msg.reconsumeTimes, t: now() });
  });
  await consumer.ready();
  emit({ event: 'started', client_id: consumer._mqClient.clientId });
  const deadline = Date.now() + args.seconds * 1000;
  while (Date.now() < deadline && !(args.stopFile && fs.existsSync(args.stopFile))) await sleep(20);
  try {
    await consumer.close();
  } catch (err) {
    emit({ event: 'close_error', error: String(err && err.message || err) });
  }
  emit({ event: 'done', count });
}

async function produce(args) {
  const producer = new Producer({ httpclient: {}, nameSrv: args.ns, producerGroup: args.group, logger: quiet });
  await producer.ready();
  for (let i = 0; i < args.count; i++) {
    const t0 = now();
    try {
      const r = await producer.send(new Message(args.topic, 'TagA', `${args.prefix}-${i}`));
      emit({ event: 'sent', idx: i, status: r.sendStatus, msg_id: r.msgId, broker: r.messageQueue.brokerName,
        queue_id: r.messageQueue.queueId, offset: r.queueOffset, t0, t1: now() });
    } catch (err) {
      emit({ event: 'error', idx: i, error: String(err && err.message || err), t0, t1: now() });
    }
  }
  try {
    await producer.close();
  } catch (err) {    // e.g. a broker that does not answer its UNREGISTER_CLIENT (a stopped slave)
    emit({ event: 'close_error', error: String(err && err.message || err) });
  }
  emit({ event: 'done' });
}

const args = parseArgs(process.argv.slice(2));
(args.cmd === 'push' ? push : produce)(args).then(() => process.exit(0), err => {
  emit({ event: 'fatal', error: String(err && err.stack || err) });
  process.exit(1);
});
