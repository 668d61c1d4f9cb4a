// Enqueueing from Node.js with amqplib (npm install amqplib): the wire contract by hand.
// Usage: node amqplib_producer.js TYPE JSON-PAYLOAD [MESSAGE-ID [MAX-RETRIES]]
const amqp = require("amqplib");

async function enqueue(channel, queue, jobType, payload, { messageId, maxRetries } = {}) {
  let returned = false;
  channel.once("return", () => { returned = true; }); // the broker returns it before confirming
  channel.publish("", queue, Buffer.from(payload), {
    persistent: true, // delivery_mode 2
    type: jobType,
    messageId, // the idempotency and cancel key: give one
    contentType: "application/json",
    headers: maxRetries === undefined ? {} : { "max-retries": maxRetries },
    mandatory: true, // no such queue: returned instead of lost
  });
  await channel.waitForConfirms(); // rejects if the broker refused it
  if (returned) throw new Error(`not enqueued: there is no queue ${queue}`);
}

async function main() {
  const [jobType, payload, messageId, maxRetries] = process.argv.slice(2);
  const url = process.env.RICOCHET_AMQP_URL || "amqp://guest:guest@localhost:5672/";
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createConfirmChannel();
    await enqueue(channel, process.env.RICOCHET_QUEUE || "jobs", jobType, payload, {
      messageId,
      maxRetries: maxRetries === undefined ? undefined : Number(maxRetries),
    });
  } finally {
    await connection.close();
  }
}

main().catch((error) => {
  console.error(error.message);
  process.exitCode = 1;
});
