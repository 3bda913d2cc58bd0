"""Translate sentences with a model served by TensorFlow Serving (gRPC or REST).

Serve an export of `keras-transformer export` (see saved_models/README.md):

    docker run -p 8501:8501 -p 8500:8500 \
        --mount type=bind,source=$PWD/saved_models/multi30k_en_de,target=/models/multi30k_en_de \
        -e MODEL_NAME=multi30k_en_de -t tensorflow/serving

then:

    python examples/serving_client.py "A dog runs on the beach." "Two men are talking."
    python examples/serving_client.py --rest < sentences.txt          # REST, standard library only
    python examples/serving_client.py --scores --version 2 "A dog."   # a given model version
    python examples/serving_client.py --batch-size 500 --in-flight 2 < test.en   # a file, fast

For a file, large requests with one in flight per server core are the fastest
(finished sentences leave the batch as the search goes); start the server
with one thread per op (`--tensorflow_intra_op_parallelism=1
--tensorflow_inter_op_parallelism=2` on two cores, see
saved_models/README.md). Translations print in input order either way.

gRPC (default, port 8500) sends a `PredictRequest` with the `tensorflow-serving-api`
package (`pip install tensorflow-serving-api`, which needs `tensorflow`);
`--rest` (port 8501) posts JSON with `urllib` only, so it runs anywhere Python
does. Either way the server does everything else: the SavedModel takes the
raw sentences and returns the translations (`translations`) and their
length-normalized log-probabilities (`scores`).

One translation is printed per input sentence (an empty line for an empty one).
"""

import argparse
import concurrent.futures
import json
import sys
import urllib.error
import urllib.request

SIGNATURE = "serving_default"


def translate_grpc(sentences, host="localhost", port=8500, model="multi30k_en_de", version=None, timeout=60.0):
    """`PredictionService.Predict` over gRPC -> (translations, scores) as Python lists."""
    if not sentences:  # nothing to send; the model would answer with empty outputs
        return [], []
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = SIGNATURE
    if version is not None:
        request.model_spec.version.value = int(version)
    data = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sentences]
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(data, dtype=tf.string, shape=[len(data)]))
    limit = 64 * 1024 * 1024
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    with grpc.insecure_channel(f"{host}:{port}", options=options) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=timeout)
    translations = [t.decode("utf-8", "replace") for t in tf.make_ndarray(response.outputs["translations"])]
    scores = [float(s) for s in tf.make_ndarray(response.outputs["scores"])]
    return translations, scores


def translate_rest(sentences, host="localhost", port=8501, model="multi30k_en_de", version=None, timeout=60.0):
    """`POST /v1/models/<model>[/versions/<v>]:predict` (columnar JSON) -> (translations, scores)."""
    if not sentences:
        return [], []
    path = f"/v1/models/{model}" + (f"/versions/{int(version)}" if version is not None else "") + ":predict"
    body = json.dumps({"signature_name": SIGNATURE, "inputs": {"inputs": list(sentences)}}).encode("utf-8")
    request = urllib.request.Request(
        f"http://{host}:{port}{path}", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as error:  # the server explains in {"error": ...}
        raise RuntimeError(f"{error.code} from {path}: {error.read().decode('utf-8', 'replace')}") from None
    # Columnar request -> {"outputs": {"translations": [...], "scores": [...]}}.
    outputs = answer["outputs"]
    return list(outputs["translations"]), [float(s) for s in outputs["scores"]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: one per line on stdin)")
    parser.add_argument("--rest", action="store_true", help="use the REST API (urllib only) instead of gRPC")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=None, help="default 8500 (gRPC) or 8501 (REST)")
    parser.add_argument("--model", default="multi30k_en_de", help="MODEL_NAME of the server")
    parser.add_argument("--version", type=int, default=None, help="model version (default: the latest served)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per request (the model takes 1-1024)")
    parser.add_argument("--in-flight", type=int, default=1, help="requests sent at once (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--scores", action="store_true", help="print 'score<TAB>translation'")
    args = parser.parse_args(argv)
    if not 1 <= args.batch_size <= 1024:
        parser.error(f"--batch-size must be between 1 and 1024 (the model's limit per request), got {args.batch_size}")
    if args.in_flight < 1:
        parser.error(f"--in-flight must be at least 1, got {args.in_flight}")

    sentences = args.sentences or read_stdin(args.rest)
    translate = translate_rest if args.rest else translate_grpc
    port = args.port or (8501 if args.rest else 8500)
    requests = [sentences[start : start + args.batch_size] for start in range(0, len(sentences), args.batch_size)]

    def send(request):
        return translate(request, args.host, port, args.model, args.version, args.timeout)

    try:
        with concurrent.futures.ThreadPoolExecutor(args.in_flight) as pool:
            for translations, scores in pool.map(send, requests):  # in input order, each as soon as it is in
                for translation, score in zip(translations, scores):
                    translation = translation.replace("\n", " ")
                    print(f"{score:.4f}\t{translation}" if args.scores else translation, flush=True)
    except Exception as error:  # noqa: BLE001 - the server's or the network's, said in one line
        raise SystemExit(
            f"serving_client: {args.host}:{port} ({'REST' if args.rest else 'gRPC'}): {describe_error(error)}"
        ) from None
    return 0


def read_stdin(rest):
    """Standard input's lines. gRPC sends them as bytes, so the model sees invalid UTF-8 as it is (and
    replaces it, as it documents); JSON can only carry text, so REST decodes with U+FFFD replacements."""
    lines = sys.stdin.buffer.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # final newline
    lines = [line.rstrip(b"\r") for line in lines]
    return [line.decode("utf-8", "replace") for line in lines] if rest else lines


def describe_error(error):
    """One line for a failed request: the unreachable server, the gRPC status, the HTTP answer."""
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        return f"cannot reach the server ({error.reason})"
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if callable(code) and callable(details):  # grpc.RpcError
        return f"{code().name}: {details()}"
    return str(error)


if __name__ == "__main__":
    sys.exit(main())
