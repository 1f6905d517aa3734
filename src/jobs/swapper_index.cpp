// The swap directory's index on disk (nvio-swap.json): read and validated when a swapper opens
// its directory (load_index adopts the tensors it lists), written when a swapper closes keeping
// its files and for each snapshot. Members of Swapper::Impl (swapper_impl.hpp), called with the
// swapper's mutex held.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "jobs/swapper_impl.hpp"
#include "nvio/json_excerpt.hpp"
#include "nvio/replace_file.hpp"

namespace nvio {

namespace {

using nlohmann::json;

constexpr const char* kIndexFormat = "nvio-swap";

}  // namespace

std::unordered_set<std::string> Swapper::Impl::load_index() {
  std::unordered_set<std::string> names;
  const std::string path = join(dir, kIndexName);
  detail::FileFacts facts;
  const int rc = detail::path_facts(path, facts);
  if (rc == -ENOENT) return names;
  if (rc < 0) throw_io_error(IoOp::Stat, path, 0, 0, -rc);
  std::string text(static_cast<std::size_t>(facts.size), '\0');
  if (!text.empty()) handle.read(text.data(), text.size(), path, 0, ReadOptions{MemoryKind::Host});
  json doc;
  try {
    doc = json::parse(text);
    if (doc.at("format").get<std::string>() != kIndexFormat || doc.at("version") != 1) {
      throw FormatError(path, "not a version 1 nvio swap index");
    }
    std::map<std::string, std::uint64_t> file_ids;
    for (const json& e : doc.at("entries")) {
      Entry entry;
      const std::string name = e.at("name").get<std::string>();
      // nlohmann converts -5 to 2^64 - 5 without a word: each count must be one already.
      const auto count = [&](const char* key) {
        const json& v = e.at(key);
        if (!v.is_number_unsigned()) {
          throw FormatError(path, fmt::format("tensor '{}': entry {} {} is not a byte count", name,
                                              key, json_excerpt(v)));
        }
        return v.get<std::uint64_t>();
      };
      entry.size = count("size");
      entry.offset = count("offset");
      // Checked before any rounding of the size (to pages, to slots) could wrap it to nothing.
      constexpr auto kMaxOffset = static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());
      if (entry.size > kMaxOffset || entry.offset > kMaxOffset - entry.size) {
        throw FormatError(path, fmt::format("tensor '{}': entry offset {} + size {} overflows "
                                            "the largest file offset {}",
                                            name, entry.offset, entry.size, kMaxOffset));
      }
      entry.meta = e.at("meta").get<std::string>();
      if (!e.at("checksum").is_null()) entry.checksum = count("checksum");
      const std::string file = e.at("file").get<std::string>();
      if (entry.size > 0) {
        if (file.empty() || file.find('/') != std::string::npos) {
          throw FormatError(path, fmt::format("entry file '{}' is not a file name", file));
        }
        auto [it, fresh] = file_ids.emplace(file, next_file_id);
        if (fresh) files[next_file_id++] = File{join(dir, file), false, false, 0, 0};
        File& f = files[it->second];
        f.end = std::max(f.end, entry.offset + entry.size);
        ++f.refs;
        entry.file = it->second;
        names.insert(file);
      }
      if (!entries.emplace(name, std::move(entry)).second) {
        throw FormatError(path, fmt::format("tensor '{}' is listed twice", name));
      }
    }
  } catch (const json::exception& e) {
    throw FormatError(path, fmt::format("malformed swap index: {}", e.what()));
  }
  return names;
}

nlohmann::json Swapper::Impl::index_document(
    const std::vector<std::pair<std::string, const Entry*>>& list,
    const std::function<std::string(const Entry&)>& file_name) const {
  json doc = {{"format", kIndexFormat}, {"version", 1}, {"entries", json::array()}};
  for (const auto& [name, e] : list) {
    json item = {
        {"name", name},        {"size", e->size},
        {"offset", e->offset}, {"file", e->size > 0 ? file_name(*e) : std::string()},
        {"meta", e->meta},     {"checksum", e->checksum ? json(*e->checksum) : json(nullptr)}};
    doc["entries"].push_back(std::move(item));
  }
  return doc;
}

void Swapper::Impl::write_index(const std::string& directory, const json& doc) {
  std::string text;
  try {
    text = doc.dump(1);
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format(
        "swapper: a tensor's name or description is not UTF-8 and cannot go into the index of "
        "'{}': {}",
        directory, e.what()));
  }
  ReplacementFile file(join(directory, kIndexName), &handle);
  file.writing([&] {
    handle.write(text.data(), text.size(), file.fd(), 0,
                 WriteOptions{Truncate::No, Durability::Data, MemoryKind::Host});
  });
  file.commit(Durability::Data);
}
}  // namespace nvio
