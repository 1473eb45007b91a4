// The harness's worker for vllm.cpp: compiled against a vllm.cpp build (its include/ and its
// static library), it speaks the worker protocol of harness/engines/launch/worker_lines.py:
//
//     vllmcpp_worker REQUEST.json RESULT.jsonl
//
// REQUEST.json: {"model": folder, "engine": {"block_size", "num_blocks", "max_model_len",
// "max_num_seqs"}, "sampling": {"temperature", "ignore_eos"}, "cases": [{"id", "prompt_text",
// "max_tokens"}]}.
//
// RESULT.jsonl: a head line ({"kind": "meta", "engine_version", "timings", "output_tokens"} once
// the engine loaded, or {"kind": "refused", "reason"} and exit code 3 when it did not: the reason
// is the engine's own words), one {"kind": "case", "id", "token_ids", "text", "finish_reason",
// "served_prompt_ids"} line per case (or {"kind": "case", "id", "error"}), then {"kind": "end"}.
//
// The engine takes text prompts only at the source this worker was written for (its input
// processor tokenizes them): the worker sends the text the harness gives and reports the ids the
// engine made of it (served_prompt_ids), so the harness judges the tokenization before the tokens.
// Every request is submitted before any is read, so the engine's scheduler batches them.

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vllm/entrypoints/model_loader.h"
#include "vllm/outputs.h"
#include "vllm/sampling_params.h"
#include "vllm/v1/engine/async_llm.h"
#include "vllm/version.h"

namespace {

using json = nlohmann::json;
constexpr int kNotStarted = 3;

void WriteLine(std::ofstream& out, const json& line) {
  out << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  out.flush();
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: vllmcpp_worker REQUEST.json RESULT.jsonl\n";
    return 2;
  }
  std::ofstream out(argv[2], std::ios::out | std::ios::trunc);
  if (!out) {
    std::cerr << "vllmcpp_worker: cannot write " << argv[2] << "\n";
    return 2;
  }
  json request;
  try {
    std::ifstream in(argv[1]);
    request = json::parse(in);
  } catch (const std::exception& e) {
    WriteLine(out, {{"kind", "error"}, {"reason", std::string("request ") + argv[1] + ": " + e.what()}});
    return kNotStarted;
  }

  const json engine_opts = request.value("engine", json::object());
  vllm::entrypoints::EngineParams params;
  params.block_size = engine_opts.value("block_size", params.block_size);
  params.num_blocks = engine_opts.value("num_blocks", params.num_blocks);
  params.max_model_len = engine_opts.value("max_model_len", params.max_model_len);
  params.max_num_seqs = engine_opts.value("max_num_seqs", params.max_num_seqs);

  const auto load_start = std::chrono::steady_clock::now();
  std::unique_ptr<vllm::entrypoints::LoadedEngine> loaded;
  try {
    loaded = vllm::entrypoints::LoadedEngine::FromModelDir(request.at("model").get<std::string>(), params);
  } catch (const std::exception& e) {
    WriteLine(out, {{"kind", "refused"}, {"reason", e.what()}});
    return kNotStarted;
  }
  const double load_s = Seconds(load_start);

  const json sampling = request.value("sampling", json::object());
  vllm::v1::AsyncLLM& engine = loaded->async_engine();
  struct Pending {
    std::string id;
    vllm::v1::AsyncRequest handle;
    std::string error;
  };
  std::vector<Pending> pending;
  const auto gen_start = std::chrono::steady_clock::now();
  for (const json& c : request.at("cases")) {
    Pending p;
    p.id = c.at("id").get<std::string>();
    try {
      vllm::SamplingParams sp;
      sp.temperature = sampling.value("temperature", 0.0);
      sp.ignore_eos = sampling.value("ignore_eos", false);
      sp.max_tokens = c.at("max_tokens").get<int>();
      sp.output_kind = vllm::RequestOutputKind::kFinalOnly;
      sp.PostInit();
      p.handle = engine.add_request(p.id, c.at("prompt_text").get<std::string>(), sp);
    } catch (const std::exception& e) {
      p.error = e.what();
    }
    pending.push_back(std::move(p));
  }

  std::vector<json> lines;
  long output_tokens = 0;
  for (Pending& p : pending) {
    if (!p.error.empty()) {
      lines.push_back({{"kind", "case"}, {"id", p.id}, {"error", p.error}});
      continue;
    }
    try {
      vllm::RequestOutput got = engine.get_output(p.handle);
      while (!got.Finished()) got = engine.get_output(p.handle);
      if (got.outputs.empty()) throw std::runtime_error("the engine returned no completion");
      const vllm::CompletionOutput& o = got.outputs.front();
      output_tokens += static_cast<long>(o.token_ids.size());
      lines.push_back({{"kind", "case"},
                       {"id", p.id},
                       {"token_ids", o.token_ids},
                       {"text", o.text},
                       {"finish_reason", o.finish_reason.value_or("")},
                       {"served_prompt_ids", got.prompt_token_ids},
                       {"logprobs_returned", o.logprobs.has_value()}});
    } catch (const std::exception& e) {
      lines.push_back({{"kind", "case"}, {"id", p.id}, {"error", e.what()}});
    }
  }
  const double generate_s = Seconds(gen_start);

  WriteLine(out, {{"kind", "meta"},
                  {"engine_version", vllm::Version()},
                  {"timings", {{"load_s", load_s}, {"generate_s", generate_s}}},
                  {"output_tokens", output_tokens}});
  for (const json& line : lines) WriteLine(out, line);
  WriteLine(out, {{"kind", "end"}});
  engine.shutdown();
  return 0;
}
