// Drives the official RocketMQ 5.x Node.js client (rocketmq-client-nodejs) for the tests;
// run by tests/support/node_rmq5.py with NODE_PATH at the client's own npm cache dir.
//
//     node node_rmq5_driver.js ENDPOINT SCENARIO 'JSON ARGS'
//
// Prints one JSON event per line on stdout; exits non-zero on any client error.
//
// Scenarios:
//   send     {"topic", "messages": [{"body", "tag"?, "keys"?, "props"?, "group"?}]}: a Producer's
//            sends -> "sent" events (message id, offset)
//   receive  {"topic", "group", "expect", "tag"?, "invisible_ms"?, "seconds"?}: a SimpleConsumer's
//            receives until `expect` messages -> "msg" (and "acked") per message
//   nack     {"topic", "group"}: receive one, change its invisible duration to 1 s, receive it
//            again (attempt 2), ack -> "msg", "changed", "msg", "acked"
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const silent = { info() {}, warn() {}, error() {}, debug() {} };

function emit(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function describe(m) {
  return {
    body: m.body.toString(), message_id: m.messageId, attempt: m.deliveryAttempt, tag: m.tag ?? null,
    keys: [ ...m.keys ].sort(), props: Object.fromEntries(m.properties), message_group: m.messageGroup ?? null,
    topic: m.topic, corrupted: m.corrupted === true, offset: m.offset ?? null,
  };
}

async function send(endpoint, args) {
  const producer = new Producer({ endpoints: endpoint, namespace: '', logger: silent, topics: [ args.topic ] });
  await producer.startup();
  try {
    for (const [ i, spec ] of args.messages.entries()) {
      const r = await producer.send({
        topic: args.topic, body: Buffer.from(spec.body), tag: spec.tag, keys: spec.keys,
        messageGroup: spec.group, properties: spec.props ? new Map(Object.entries(spec.props)) : undefined,
      });
      emit({ event: 'sent', i, message_id: r.messageId, transaction_id: r.transactionId, offset: Number(r.offset) });
    }
  } finally {
    await producer.shutdown();
  }
}

async function consumer(endpoint, args) {
  const c = new SimpleConsumer({
    endpoints: endpoint, namespace: '', consumerGroup: args.group, logger: silent, awaitDuration: 5000,
    subscriptions: new Map().set(args.topic, args.tag || '*'),
  });
  await c.startup();
  return c;
}

async function receive(endpoint, args) {
  const c = await consumer(endpoint, args);
  const deadline = Date.now() + (args.seconds || 30) * 1000;
  let got = 0;
  try {
    while (got < args.expect && Date.now() < deadline) {
      for (const m of await c.receive(32, args.invisible_ms || 15000)) {
        got++;
        emit({ event: 'msg', ...describe(m) });
        await c.ack(m);
        emit({ event: 'acked', message_id: m.messageId });
      }
    }
  } finally {
    await c.shutdown();
  }
}

async function receiveOne(c) {
  const deadline = Date.now() + 20000;
  while (Date.now() < deadline) {
    const ms = await c.receive(1, 10000);
    if (ms.length) return ms[0];
  }
  throw new Error('no message received');
}

async function nack(endpoint, args) {
  const c = await consumer(endpoint, args);
  try {
    const m = await receiveOne(c);
    emit({ event: 'msg', ...describe(m) });
    await c.changeInvisibleDuration(m, 1000);
    emit({ event: 'changed' });
    const again = await receiveOne(c);
    emit({ event: 'msg', ...describe(again) });
    await c.ack(again);
    emit({ event: 'acked', message_id: again.messageId });
  } finally {
    await c.shutdown();
  }
}

const [ endpoint, scenario, raw ] = process.argv.slice(2);
const run = { send, receive, nack }[scenario];
run(endpoint, JSON.parse(raw)).then(() => process.exit(0), err => {
  process.stderr.write(`${err && err.stack || err}\n`);
  process.exit(1);
});
