// Calls a KServe v2 gRPC server with Node's grpc-js, using stubs loaded from the repository's own
// .proto files, and prints what each call answered as one JSON object for tests/e2e/test_grpc_js.py.
// Usage: node client.js HOST:PORT REPOSITORY_ROOT
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [target, root] = process.argv.slice(2);
const definition = protoLoader.loadSync(path.join(root, "serve_app", "protos", "grpc_service.proto"), {
  includeDirs: [root],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const inference = grpc.loadPackageDefinition(definition).inference;
const client = new inference.GRPCInferenceService(target, grpc.credentials.createInsecure());

function deadline() {
  return new Date(Date.now() + 60000);
}

function unary(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

function fp32(values) {
  return Buffer.from(new Float32Array(values).buffer);
}

function floats(buffer) {
  const copy = Buffer.from(buffer);
  return Array.from(new Float32Array(copy.buffer, copy.byteOffset, copy.length / 4));
}

const a = Array.from({ length: 16 }, (_, i) => i);
const b = Array.from({ length: 16 }, () => 1);

function addSubRequest(contents) {
  const inputs = [
    { name: "INPUT0", datatype: "FP32", shape: ["1", "16"] },
    { name: "INPUT1", datatype: "FP32", shape: ["1", "16"] },
  ];
  const request = { model_name: "add_sub", id: contents, inputs };
  if (contents === "raw") {
    request.raw_input_contents = [fp32(a), fp32(b)];
  } else {
    inputs[0].contents = { fp32_contents: a };
    inputs[1].contents = { fp32_contents: b };
  }
  return request;
}

function outputs(response) {
  const result = {};
  response.outputs.forEach((out, i) => {
    result[out.name] = {
      datatype: out.datatype,
      shape: out.shape.map(Number),
      values: response.raw_output_contents.length ? floats(response.raw_output_contents[i]) : out.contents.fp32_contents,
    };
  });
  return result;
}

function stream(n) {
  return new Promise((resolve, reject) => {
    const call = client.ModelStreamInfer({ deadline: deadline() });
    const answers = [];
    call.on("data", (message) => {
      const response = message.infer_response;
      answers.push({
        error: message.error_message,
        id: response.id,
        out: response.raw_output_contents.map((buf) => Buffer.from(buf).readInt32LE(0)),
      });
    });
    call.on("error", reject);
    call.on("end", () => resolve(answers));
    const inputs = [{ name: "IN", datatype: "INT32", shape: ["1"] }];
    const raw = Buffer.alloc(4);
    raw.writeInt32LE(n, 0);
    call.write({ model_name: "py_square", id: "square", inputs, raw_input_contents: [raw] });
    call.end();
  });
}

async function main() {
  const result = {};
  result.live = (await unary("ServerLive", {})).live;
  result.ready = (await unary("ServerReady", {})).ready;
  result.model_ready = (await unary("ModelReady", { name: "add_sub", version: "" })).ready;
  result.server_metadata = await unary("ServerMetadata", {});
  result.model_metadata = await unary("ModelMetadata", { name: "add_sub", version: "" });
  const config = (await unary("ModelConfig", { name: "add_sub", version: "" })).config;
  result.config = { name: config.name, max_batch_size: config.max_batch_size, inputs: config.input.map((i) => i.name) };
  for (const contents of ["raw", "typed"]) {
    const response = await unary("ModelInfer", addSubRequest(contents));
    result[contents] = { id: response.id, model_name: response.model_name, outputs: outputs(response) };
  }
  try {
    await unary("ModelInfer", { model_name: "no_such_model", inputs: [] });
    result.unknown = null;
  } catch (err) {
    result.unknown = { code: grpc.status[err.code], details: err.details };
  }
  result.stream = await stream(3);
  process.stdout.write(JSON.stringify(result) + "\n");
}

main()
  .then(() => client.close())
  .catch((err) => {
    process.stderr.write(`grpc-js call failed: ${err.stack || err}\n`);
    client.close();
    process.exit(1);
  });
