import json, os, sys

args = json.loads(os.environ["DAMA_ARGS"])  # {"files": ["/data/a.csv", ...]}
first = json.loads(os.environ["DAMA_CHECKPOINT"] or "{}").get("next", 0)  # empty on a first attempt
events = os.fdopen(int(os.environ["DAMA_EVENTS_FD"]), "w", buffering=1)  # one JSON object a line
def report(type, payload): print(json.dumps({"type": type, "payload": payload}), file=events)

for i, name in enumerate(args["files"][first:], first):  # from the file after the last one done
    if not os.path.exists(name):  # no retry can help: fail for good, saying why
        report("failure", {"error": f"{name} is missing", "retry": False})
        sys.exit(1)
    with open(name) as f:  # anything raised fails the attempt: it is retried
        report("rows_loaded", {"file": name, "rows": sum(1 for _ in f)})
    report("checkpoint", {"next": i + 1})  # a retry starts from here
    report("progress", {"step": i + 1, "of": len(args["files"])})
