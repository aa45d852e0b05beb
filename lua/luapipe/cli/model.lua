-- luapipe model: a DeepSeek-V3 checkpoint folder (DeepSeek's converted
-- layout or Hugging Face's) described, run forward, or differentiated.
--
--   luapipe model info DIR
--   luapipe model forward DIR --tokens FILE.json -o OUT.safetensors [--precision bf16]
--   luapipe model grad DIR --tokens FILE.json -o OUT.safetensors [--precision bf16]
--
-- FILE.json is {"tokens": [[ids...], ...]} (grad: and "targets", the same
-- shape). forward writes `logits` [B, T, V] float32 for every position;
-- grad prints `loss X` (mean cross-entropy over every position) and writes
-- every trained parameter's gradient under its name in DIR's files (the
-- check of llm.c's test_gpt2 against PyTorch). --precision bf16 runs the
-- GEMMs on bf16-rounded inputs with float32 sums, as train{precision =
-- "bf16"} does (outputs stay float32). A bad folder, config or
-- tokens file is one line naming the file (and tensor), exit 2; nothing is
-- written then.
local core = require("luapipe.core")
local json = require("luapipe.json")
local util = require("luapipe.util")

local M = {}

function M.parser(p)
  p:argument("action", "info, forward or grad."):choices({ "info", "forward", "grad" })
  p:argument("dir", "The checkpoint folder (config.json and safetensors files)."):argname("DIR")
  p:option("--tokens", "JSON file {\"tokens\": [[ids...], ...], \"targets\": [[ids...], ...]} "
    .. "(targets: grad only).")
    :argname("FILE")
  p:option("--output -o", "The safetensors file to write (forward: logits; grad: the gradients).")
    :argname("OUT")
  p:option("--precision", "GEMM precision of forward / grad: f32, or bf16 (bf16 inputs with "
    .. "float32 sums; norms, softmax, routers and the outputs stay float32).", "f32")
    :argname("P")
  p:epilog("Examples:\n"
    .. "  luapipe model info DeepSeek-V2-Lite\n"
    .. "  luapipe model forward ckpt --tokens batch.json -o logits.safetensors\n"
    .. "  luapipe model grad ckpt --tokens batch.json -o grads.safetensors\n"
    .. "  luapipe model forward ckpt --tokens batch.json -o logits.safetensors --precision bf16\n"
    .. "Layouts: DeepSeek's converted form (config.json with model.py's ModelArgs keys, "
    .. "model0-mp1.safetensors, model.py's names) or Hugging Face's (config.json with its keys, "
    .. "model.safetensors or shards with model.safetensors.index.json, HF names); F32, BF16 "
    .. "or FP8 E4M3 with 128x128 block scales. `luapipe help models` for the Lua API.")
  return p
end

local function fail(msg, code) return require("luapipe.cli").fail("model", msg, code or 2) end

local function plural(n, w) return string.format("%d %s%s", n, w, n == 1 and "" or "s") end

local function count_text(n)
  if n >= 1e9 then return string.format("%.2f B", n / 1e9) end
  if n >= 1e6 then return string.format("%.2f M", n / 1e6) end
  return tostring(n)
end

local function info(model)
  local a = model.args
  local out = {}
  local function w(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  w("%s: DeepSeek-V3 architecture (model.py), %s", model.dir, model.form == "hf"
    and string.format("Hugging Face's layout (%s)", plural(#model.ckpt.files, "file"))
    or "DeepSeek's converted layout (model0-mp1.safetensors)")
  w("  vocab %d, dim %d, %s (%d dense, %d MoE), %s", a.vocab_size, a.dim,
    plural(a.n_layers, "layer"),
    a.n_dense_layers, a.n_layers - a.n_dense_layers, plural(a.n_heads, "head"))
  w("  attention: MLA, %s, kv_lora_rank %d, qk_nope/rope/v head dims %d/%d/%d%s",
    a.q_lora_rank > 0 and ("q_lora_rank " .. a.q_lora_rank) or "no query LoRA (wq)",
    a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim,
    a.max_seq_len > a.original_seq_len and string.format(", YaRN (factor %g, mscale %g, %d -> %d)",
      a.rope_factor, a.mscale, a.original_seq_len, a.max_seq_len) or "")
  w("  feed-forward: SwiGLU %d (dense layers); MoE of %d routed experts of %d, top %d%s, "
    .. "%s router%s, route_scale %g; %d shared", a.inter_dim, a.n_routed_experts, a.moe_inter_dim,
    a.n_activated_experts, a.n_expert_groups > 1 and string.format(" (%d groups, keep %d)",
      a.n_expert_groups, a.n_limited_groups) or "", a.score_func,
    a.correction_bias and " with correction bias" or "", a.route_scale, a.n_shared_experts)
  local kinds = {}
  for i = 0, a.n_layers - 1 do kinds[#kinds + 1] = i < a.n_dense_layers and "dense" or "moe" end
  w("  layers: %s", table.concat(kinds, " "))
  local total, active = model:counts()
  w("  parameters: %s in total, %s activated per token", count_text(total), count_text(active))
  local dts = {}
  for d, n in pairs(model.dtypes) do dts[#dts + 1] = string.format("%s x %d", d, n) end
  table.sort(dts)
  w("  stored dtypes: %s", table.concat(dts, ", "))
  if #model.unused == 0 then
    w("  tensors not used: none")
  else
    local mtp = a.mtp > 0 and string.format(" (the %s: num_nextn_predict_layers)",
      plural(a.mtp, "multi-token-prediction layer")) or ""
    w("  tensors not used: %d%s, e.g. %s", #model.unused, mtp, model.unused[1])
  end
  io.write(table.concat(out, "\n"), "\n")
end

-- tokens.json -> input Tensor, target Tensor | nil (and B, T), or nil, msg
local function read_tokens(path, need_targets)
  local text = util.read_file(path)
  if not text then return nil, path .. ": cannot be read" end
  local ok, t = pcall(json.decode, text)
  if not ok then return nil, path .. ": not valid JSON" end
  local function grid(key)
    local v = type(t) == "table" and t[key]
    if type(v) ~= "table" or #v == 0 or type(v[1]) ~= "table" or #v[1] == 0 then
      return nil, string.format("%s: '%s' must be a non-empty list of equal-length "
        .. "lists of token ids", path, key)
    end
    local flat, T = {}, #v[1]
    for b, row in ipairs(v) do
      if type(row) ~= "table" or #row ~= T then
        return nil, string.format("%s: %s[%d] has %s, %s[1] has %d", path, key, b,
          type(row) == "table" and tostring(#row) or "no list", key, T)
      end
      for j, id in ipairs(row) do
        if math.type(id) ~= "integer" and not (type(id) == "number" and id == math.floor(id)) then
          return nil, string.format("%s: %s[%d][%d] is not an integer token id", path, key, b, j)
        end
        flat[#flat + 1] = id
      end
    end
    return flat, #v, T
  end
  local x, B, T = grid("tokens")
  if not x then return nil, B end
  local y, B2, T2
  if need_targets then
    y, B2, T2 = grid("targets")
    if not y then return nil, B2 end
    if B2 ~= B or T2 ~= T then
      return nil, string.format("%s: targets are %dx%d, tokens %dx%d", path, B2, T2, B, T)
    end
  end
  return { x = x, y = y, B = B, T = T }
end

local function check_ids(path, key, ids, V)
  for i, id in ipairs(ids) do
    if id < 0 or id >= V then
      return string.format("%s: %s entry %d is %d, outside the vocabulary [0, %d)", path,
        key, i, id, V)
    end
  end
end

function M.run(args)
  local models = require("luapipe.models")
  local ok, model = pcall(models.load, args.dir)
  if not ok then return fail(model) end
  if args.action == "info" then
    info(model)
    return 0
  end
  if not args.tokens then return fail(args.action .. " needs --tokens FILE.json") end
  if not args.output then return fail(args.action .. " needs -o OUT.safetensors") end
  if args.precision ~= "f32" and args.precision ~= "bf16" then
    return fail(string.format("--precision %s: unknown precision (f32 or bf16)", args.precision))
  end
  model:set_precision(args.precision)
  local tk, err = read_tokens(args.tokens, args.action == "grad")
  if not tk then return fail(err) end
  local V = model.args.vocab_size
  err = check_ids(args.tokens, "tokens", tk.x, V) or (tk.y and check_ids(args.tokens,
    "targets", tk.y, V))
  if err then return fail(err) end
  if tk.T > model.args.max_seq_len then
    return fail(string.format("%s: %d tokens per sequence, more than max_seq_len %d",
      args.tokens, tk.T, model.args.max_seq_len))
  end
  local bok, layer = pcall(model.build, model, 0)
  if not bok then return fail(layer) end
  local x = core.tensor({ tk.B, tk.T }, tk.x)
  local wok, werr
  if args.action == "forward" then
    local logits = layer:forward(x)
    wok, werr = core.safetensors_write(args.output, { logits = logits })
    logits:close()
  else
    local y = core.tensor({ tk.B, tk.T }, tk.y)
    local opt = core.nn_optim(layer, { kind = "sgd", lr = 0 })
    local loss, lerr = core.nn_reference_step(layer, opt, "cross_entropy", 1,
      function() return x, y end, 1)
    if not loss then return fail(lerr, 1) end
    local names = require("luapipe.models.names")
    local grads, order = {}, {}
    for _, p in ipairs(layer:params(true)) do
      local n = names.to_model(p.name)
      if model.form == "hf" then n = names.to_hf(n) end
      grads[n] = core.tensor(p.shape, p.value)
      order[#order + 1] = n
    end
    wok, werr = core.safetensors_write(args.output, grads, { order = order })
    for _, t in pairs(grads) do t:close() end
    if wok then io.write(string.format("loss %.8f\n", loss)) end
  end
  layer:close()
  if not wok then return fail(werr, 1) end
  return 0
end

return M
