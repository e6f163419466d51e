// Checkpoints: a round trip restores model, optimizer, epoch, step and run id; damaged
// or mismatched files are refused with a clear error and change nothing; files of
// the previous format version still load.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ddp/checkpoint.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"
#include "ddp/types.hpp"
#include "subprocess.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<float> values(ddp::Module& m) {
  std::vector<float> v;
  for (auto* p : m.parameters()) v.insert(v.end(), p->value.span().begin(), p->value.span().end());
  return v;
}

// A few training steps so the optimizer has non-trivial state.
void train(ddp::Sequential& model, ddp::Optimizer& opt, int steps) {
  ddp::Tensor x(4, 6);
  ddp::Rng rng(1);
  for (float& v : x.span()) v = rng.uniform(-1, 1);
  std::vector<int32_t> labels = {0, 1, 2, 1};
  ddp::Tensor d;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    ddp::softmax_cross_entropy(model.forward(x), labels, d);
    model.backward(d);
    opt.step();
  }
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Saves a checkpoint of an MLP 6-5-3 and its SGD (momentum) after one step to
// `path`; returns the file's bytes and the optimizer's state as save_state wrote it.
std::pair<std::string, std::string> save_sgd_checkpoint(const std::string& path) {
  auto model = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::SGD opt(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  train(*model, opt, 1);
  ddp::save_checkpoint(path, *model, &opt, {.epoch = 1, .step = 1, .run_id = "first"});
  std::ostringstream state;
  opt.save_state(state);
  return {read(path), state.str()};
}

// A checkpoint file of `version` around `payload`: the header's size and CRC-32 made
// to fit, so that a test can change the payload and see only what it changed.
std::string with_header(uint32_t version, const std::string& payload) {
  std::string file = "DDPCKPT";
  file.push_back('\0');
  const uint64_t size = payload.size();
  const auto crc = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(payload.size())));
  file.append(reinterpret_cast<const char*>(&version), 4);
  file.append(reinterpret_cast<const char*>(&size), 8);
  file.append(reinterpret_cast<const char*>(&crc), 4);
  return file + payload;
}

constexpr size_t kHeader = 24;

}  // namespace

TEST_CASE("a checkpoint round-trips model, optimizer, epoch and step", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  auto model = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::AdamW opt(model->parameters(), {.lr = 0.01f});
  train(*model, opt, 3);
  ddp::save_checkpoint(path, *model, &opt, {.epoch = 2, .step = 3, .run_id = "r"});
  // Only the checkpoint is left: the temporary file was renamed into place.
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}) == 1);

  auto restored = ddp::make_mlp({{6, 5, 3}, 99});  // different init
  ddp::AdamW opt2(restored->parameters(), {.lr = 0.01f});
  REQUIRE(values(*restored) != values(*model));
  const ddp::CheckpointInfo info = ddp::load_checkpoint(path, *restored, &opt2);
  CHECK(info.epoch == 2);
  CHECK(info.step == 3);
  CHECK(values(*restored) == values(*model));
  CHECK(opt2.steps() == 3);

  // Training on from both gives identical parameters.
  train(*model, opt, 2);
  train(*restored, opt2, 2);
  CHECK(values(*restored) == values(*model));

  // Overwriting works, and a model can be loaded without its optimizer.
  ddp::SGD sgd(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  train(*model, sgd, 2);
  ddp::save_checkpoint(path, *model, &sgd, {.epoch = 5, .step = 7, .run_id = "r"});
  auto weights_only = ddp::make_mlp({{6, 5, 3}, 3});
  CHECK(ddp::load_checkpoint(path, *weights_only, nullptr).step == 7);
  CHECK(values(*weights_only) == values(*model));
  ddp::SGD sgd2(weights_only->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  ddp::load_checkpoint(path, *weights_only, &sgd2);
  CHECK(sgd2.momentum_buffer(0).size() == 30);
  CHECK(sgd2.steps() == 2);
}

TEST_CASE("damaged checkpoints are refused and change nothing", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  const std::string good = save_sgd_checkpoint(path).first;

  auto target = ddp::make_mlp({{6, 5, 3}, 2});
  ddp::SGD target_opt(target->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  const auto before = values(*target);
  auto refused = [&](const std::string& bytes, const std::string& why) {
    write(path, bytes);
    CHECK_THROWS_WITH(ddp::load_checkpoint(path, *target, &target_opt), Catch::Contains(path) && Catch::Contains(why));
    CHECK(values(*target) == before);
    CHECK(target_opt.steps() == 0);
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  refused(flipped, "checksum");
  refused(good.substr(0, good.size() - 9), "truncated");
  refused(good.substr(0, 10), "truncated header");
  refused(good + "xx", "trailing");
  std::string magic = good;
  magic[0] = 'X';
  refused(magic, "bad magic");
  std::string version = good;
  version[8] = 9;
  refused(version, "version 9");
  refused("", "truncated header");

  CHECK_THROWS_WITH(ddp::load_checkpoint((dir / "missing.ckpt").string(), *target, nullptr),
                    Catch::Contains("missing.ckpt"));
}

TEST_CASE("bytes after a valid optimizer state are refused and leave the optimizer as it was",
          "[train][checkpoint]") {
  // The payload ends with the optimizer's state behind its u64 size: grow the size
  // by two, append two bytes, and fix the header's size and CRC-32 so that only
  // the optimizer state's end shows the damage (after the optimizer has read it).
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  const auto [bytes, state] = save_sgd_checkpoint(path);
  const size_t state_size = state.size();
  std::string payload = bytes.substr(kHeader);
  const size_t size_at = payload.size() - state_size - 8;
  const uint64_t grown = state_size + 2;
  std::memcpy(payload.data() + size_at, &grown, 8);
  payload += "xx";
  write(path, with_header(2, payload));

  auto target = ddp::make_mlp({{6, 5, 3}, 2});
  ddp::SGD target_opt(target->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  train(*target, target_opt, 2);  // state of its own, which must survive
  std::ostringstream before_state;
  target_opt.save_state(before_state);
  const auto before = values(*target);
  CHECK_THROWS_WITH(ddp::load_checkpoint(path, *target, &target_opt), Catch::Contains("trailing data after the optimizer"));
  std::ostringstream after_state;
  target_opt.save_state(after_state);
  CHECK(after_state.str() == before_state.str());
  CHECK(target_opt.steps() == 2);
  CHECK(values(*target) == before);
}

TEST_CASE("a checkpoint of another model or optimizer is refused", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  auto model = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::AdamW opt(model->parameters(), {});
  train(*model, opt, 1);
  ddp::save_checkpoint(path, *model, &opt, {});

  auto wider = ddp::make_mlp({{6, 7, 3}, 1});
  const auto before = values(*wider);
  CHECK_THROWS_WITH(ddp::load_checkpoint(path, *wider, nullptr), Catch::Contains("0.weight"));
  CHECK(values(*wider) == before);

  auto deeper = ddp::make_mlp({{6, 5, 5, 3}, 1});
  CHECK_THROWS_WITH(ddp::load_checkpoint(path, *deeper, nullptr), Catch::Contains("4 parameters"));

  auto same = ddp::make_mlp({{6, 5, 3}, 4});
  const auto same_before = values(*same);
  ddp::SGD sgd(same->parameters(), {});
  CHECK_THROWS_WITH(ddp::load_checkpoint(path, *same, &sgd), Catch::Contains("adamw"));
  CHECK(values(*same) == same_before);  // the optimizer mismatch left the model alone too

  ddp::save_checkpoint(path, *model, nullptr, {});
  ddp::AdamW fresh(same->parameters(), {});
  CHECK_THROWS_WITH(ddp::load_checkpoint(path, *same, &fresh), Catch::Contains("no optimizer state"));

  CHECK_THROWS_WITH(ddp::save_checkpoint((dir / "no/such/dir/x.ckpt").string(), *model, nullptr, {}),
                    Catch::Contains("no/such/dir"));
}

TEST_CASE("a checkpoint keeps the run id that wrote it, readable without a model", "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  auto model = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::AdamW opt(model->parameters(), {});
  train(*model, opt, 2);
  ddp::save_checkpoint(path, *model, &opt, {.epoch = 4, .step = 40, .run_id = "job-7"});
  const ddp::CheckpointInfo peeked = ddp::checkpoint_info(read(path), path);
  CHECK(peeked.epoch == 4);
  CHECK(peeked.step == 40);
  CHECK(peeked.run_id == "job-7");
  auto restored = ddp::make_mlp({{6, 5, 3}, 2});
  CHECK(ddp::load_checkpoint(path, *restored, nullptr).run_id == "job-7");
  CHECK(values(*restored) == values(*model));

  // checkpoint_info validates the header as loading does.
  std::string flipped = read(path);
  flipped[flipped.size() - 3] ^= 0x01;
  CHECK_THROWS_WITH(ddp::checkpoint_info(flipped, path), Catch::Contains(path) && Catch::Contains("checksum"));
  // A run id that would not read back is refused when saving, not found out later.
  CHECK_THROWS_WITH(ddp::save_checkpoint(path, *model, &opt, {.run_id = std::string(5000, 'x')}),
                    Catch::Contains("run id"));
  CHECK(ddp::checkpoint_info(read(path), path).run_id == "job-7");  // the old file is still there
}

TEST_CASE("a checkpoint of format version 1 (no run id) still loads", "[train][checkpoint]") {
  // Version 1's payload is version 2's without the run id (u32 length + bytes)
  // after epoch and step.
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  auto model = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::SGD opt(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  train(*model, opt, 2);
  ddp::save_checkpoint(path, *model, &opt, {.epoch = 3, .step = 9, .run_id = "abc"});
  std::string payload = read(path).substr(kHeader);
  payload.erase(16, 4 + 3);
  write(path, with_header(1, payload));

  auto restored = ddp::make_mlp({{6, 5, 3}, 2});
  ddp::SGD opt2(restored->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  const ddp::CheckpointInfo info = ddp::load_checkpoint(path, *restored, &opt2);
  CHECK(info.epoch == 3);
  CHECK(info.step == 9);
  CHECK(info.run_id.empty());
  CHECK(values(*restored) == values(*model));
  CHECK(opt2.steps() == 2);
}

TEST_CASE("load_optimizer_state reads only the optimizer half, validated as a whole load is", "[train][checkpoint]") {
  // Sharded strategies load the model before wrapping it and the optimizer once it
  // exists: the optimizer half alone must restore exactly what a whole load would.
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  auto model = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::AdamW opt(model->parameters(), {.lr = 0.01f});
  train(*model, opt, 3);
  ddp::save_checkpoint(path, *model, &opt, {.epoch = 2, .step = 3, .run_id = "r"});
  std::ostringstream saved;
  opt.save_state(saved);

  auto other = ddp::make_mlp({{6, 5, 3}, 7});
  const auto other_values = values(*other);
  ddp::AdamW opt2(other->parameters(), {.lr = 0.01f});
  ddp::load_optimizer_state(read(path), path, opt2);
  std::ostringstream loaded;
  opt2.save_state(loaded);
  CHECK(loaded.str() == saved.str());
  CHECK(opt2.steps() == 3);
  CHECK(values(*other) == other_values);  // the model is not its business

  // Version 1 files carry the same optimizer half.
  std::string payload = read(path).substr(kHeader);
  payload.erase(16, 4 + 1);  // the run id "r"
  ddp::AdamW opt_v1(other->parameters(), {.lr = 0.01f});
  ddp::load_optimizer_state(with_header(1, payload), path, opt_v1);
  CHECK(opt_v1.steps() == 3);
}

TEST_CASE("load_optimizer_state refuses a checkpoint without state, of another kind or damaged, naming the file",
          "[train][checkpoint]") {
  testing::TempDir dir;
  const std::string path = (dir / "model.ckpt").string();
  const auto [good, state] = save_sgd_checkpoint(path);

  auto model = ddp::make_mlp({{6, 5, 3}, 2});
  ddp::SGD sgd(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  train(*model, sgd, 2);
  std::ostringstream before;
  sgd.save_state(before);
  auto refused = [&](ddp::Optimizer& opt, const std::string& bytes, const std::string& why) {
    CHECK_THROWS_WITH(ddp::load_optimizer_state(bytes, path, opt), Catch::Contains(path) && Catch::Contains(why));
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  refused(sgd, flipped, "checksum");
  refused(sgd, good.substr(0, good.size() - 9), "truncated");
  refused(sgd, good + "xx", "trailing");
  refused(sgd, "", "truncated header");
  // Trailing bytes inside the optimizer's part show only after it has read them.
  std::string payload = good.substr(kHeader);
  const size_t size_at = payload.size() - state.size() - 8;
  const uint64_t grown = state.size() + 2;
  std::memcpy(payload.data() + size_at, &grown, 8);
  refused(sgd, with_header(2, payload + "xx"), "trailing data after the optimizer");
  std::ostringstream after;
  sgd.save_state(after);
  CHECK(after.str() == before.str());  // every refusal left the state as it was
  CHECK(sgd.steps() == 2);

  ddp::AdamW adamw(model->parameters(), {});
  refused(adamw, good, "'sgd'");  // the checkpoint's kind, not this optimizer's
  CHECK(adamw.steps() == 0);
  auto wider = ddp::make_mlp({{6, 7, 3}, 2});
  ddp::SGD wider_sgd(wider->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  refused(wider_sgd, good, "5x6");  // its shapes are the optimizer's to check

  auto bare = ddp::make_mlp({{6, 5, 3}, 1});
  ddp::save_checkpoint(path, *bare, nullptr, {});
  refused(sgd, read(path), "no optimizer state");
}
