"""Run in vLLM's own venv (``.venv-vllm/bin/python tests/serving/vllm_generate.py spec.json out.json``) by the tests
of this folder: for each of the spec's folders in turn, one ``LLM`` on it, then each of its runs of prompts (token
ids) with their sampling parameters; writes each request's generated tokens and the logprob vLLM gave each of them,
or, for a folder whose engine did not start, the error it raised. One process for all the folders: each but the
first saves vLLM's import (~10 s). No TNN import: the plugin's entry point registers the model."""

import gc
import json
import sys
import time
import traceback

FOLDER_MARK = "=== vllm_generate.py: the next folder ===\n"  # where each folder's part of the output starts

if __name__ == "__main__":  # vLLM starts its engine by spawning: the guard keeps the children from rerunning this
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.load(open(sys.argv[1]))
    results = {"folders": []}
    for served in spec["folders"]:
        print(FOLDER_MARK, end="", flush=True)
        started = time.perf_counter()
        try:
            llm = LLM(model=served["folder"], trust_remote_code=True, dtype="float32", enforce_eager=True,
                      max_model_len=2048, skip_tokenizer_init=True, seed=0, **spec.get("engine", {}))
        except Exception:  # a refused folder: the next ones still run
            traceback.print_exc()
            results["folders"].append({"error": traceback.format_exc()})
            continue
        folder = {"startup_s": time.perf_counter() - started, "runs": []}
        for run in served["runs"]:
            started = time.perf_counter()
            outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in run["prompts"]],
                                   SamplingParams(**run["sampling"]), use_tqdm=False)
            requests = []
            for output in outputs:
                completion = output.outputs[0]
                logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [],
                                                                       completion.token_ids)]
                requests.append({"tokens": list(completion.token_ids), "logprobs": logprobs})
            folder["runs"].append({"requests": requests, "seconds": time.perf_counter() - started})
        results["folders"].append(folder)
        llm.llm_engine.engine_core.shutdown()  # its engine's processes end before the next folder's start
        del llm
        gc.collect()
    json.dump(results, open(sys.argv[2], "w"))
