"""Run in vLLM's own venv (``.venv-vllm/bin/python tests/serving/vllm_generate.py spec.json out.json``) by the tests
of this folder: one ``LLM`` on a saved folder, then each run of the spec's prompts (token ids) with its sampling
parameters; writes each request's generated tokens and the logprob vLLM gave each of them. No TNN import: the
plugin's entry point registers the model."""

import json
import sys
import time

if __name__ == "__main__":  # vLLM starts its engine by spawning: the guard keeps the children from rerunning this
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.load(open(sys.argv[1]))
    started = time.perf_counter()
    llm = LLM(model=spec["folder"], trust_remote_code=True, dtype="float32", enforce_eager=True, max_model_len=2048,
              skip_tokenizer_init=True, seed=0, **spec.get("engine", {}))
    results = {"startup_s": time.perf_counter() - started, "runs": []}
    for run in spec["runs"]:
        started = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in run["prompts"]],
                               SamplingParams(**run["sampling"]), use_tqdm=False)
        requests = []
        for output in outputs:
            completion = output.outputs[0]
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [], completion.token_ids)]
            requests.append({"tokens": list(completion.token_ids), "logprobs": logprobs})
        results["runs"].append({"requests": requests, "seconds": time.perf_counter() - started})
    json.dump(results, open(sys.argv[2], "w"))
