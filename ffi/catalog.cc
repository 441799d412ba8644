#include "catalog.h"

#include <array>
#include <cstring>
#include <fstream>
#include <iterator>

namespace variopath {

namespace {

size_t dtype_size(uint8_t dtype) {
  switch (dtype) {
    case 1: return 2;
    case 2: return 4;
    case 3: return 8;
    case 4: return 8;
    case 5: return 1;
    default: return 0;
  }
}

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

// Little-endian reads; the format is little-endian and so is every platform we build for.
template <typename T>
T read(const std::vector<uint8_t>& buf, size_t& pos, size_t end, const std::string& path) {
  if (pos + sizeof(T) > end) throw CatalogError(path + ": malformed catalog (truncated array table)");
  T value;
  std::memcpy(&value, buf.data() + pos, sizeof(T));
  pos += sizeof(T);
  return value;
}

}  // namespace

uint32_t crc32(const uint8_t* data, size_t n) {
  static const auto table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

size_t RawArray::size() const {
  size_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

template <typename T>
std::vector<T> RawArray::as() const {
  if (sizeof(T) != dtype_size(dtype)) throw CatalogError("catalog array read with the wrong element size");
  std::vector<T> out(size());
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

template std::vector<int16_t> RawArray::as<int16_t>() const;
template std::vector<int32_t> RawArray::as<int32_t>() const;
template std::vector<int64_t> RawArray::as<int64_t>() const;
template std::vector<double> RawArray::as<double>() const;
template std::vector<uint8_t> RawArray::as<uint8_t>() const;

const RawArray& CatalogFile::at(const std::string& name) const {
  auto it = arrays.find(name);
  if (it == arrays.end()) throw CatalogError("catalog has no array '" + name + "'");
  return it->second;
}

std::string CatalogFile::fingerprint() const {
  const auto& a = at("fingerprint");
  return std::string(a.bytes.begin(), a.bytes.end());
}

CatalogFile load_catalog_file(const std::string& path, const std::string& expected_fingerprint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CatalogError(path + ": cannot open catalog file");
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return load_catalog_bytes(buf, path, expected_fingerprint);
}

CatalogFile load_catalog_bytes(const std::vector<uint8_t>& buf, const std::string& path,
                               const std::string& expected_fingerprint) {
  static const char magic[6] = {'V', 'P', 'C', 'A', 'T', '\0'};
  if (buf.size() < 12 || std::memcmp(buf.data(), magic, 6) != 0)
    throw CatalogError(path + ": not a variopath catalog file");
  CatalogFile file;
  std::memcpy(&file.version, buf.data() + 6, 2);
  if (file.version != kCatalogVersion)
    throw CatalogError(path + ": catalog format version " + std::to_string(file.version) +
                       "; this library reads version " + std::to_string(kCatalogVersion) + "; rebuild it");
  const size_t end = buf.size() - 4;
  uint32_t stored;
  std::memcpy(&stored, buf.data() + end, 4);
  if (crc32(buf.data(), end) != stored)
    throw CatalogError(path + ": checksum mismatch: the file is truncated or corrupted; rebuild it");
  size_t pos = 8;
  const auto count = read<uint32_t>(buf, pos, end, path);
  for (uint32_t k = 0; k < count; ++k) {
    const auto nlen = read<uint16_t>(buf, pos, end, path);
    if (pos + nlen > end) throw CatalogError(path + ": malformed catalog (truncated name)");
    std::string name(reinterpret_cast<const char*>(buf.data() + pos), nlen);
    pos += nlen;
    RawArray arr;
    arr.dtype = read<uint8_t>(buf, pos, end, path);
    const auto ndim = read<uint8_t>(buf, pos, end, path);
    if (dtype_size(arr.dtype) == 0) throw CatalogError(path + ": array '" + name + "' has an unknown dtype");
    for (int d = 0; d < ndim; ++d) arr.shape.push_back(read<uint64_t>(buf, pos, end, path));
    const auto nbytes = read<uint64_t>(buf, pos, end, path);
    if (pos + nbytes > end || nbytes != arr.size() * dtype_size(arr.dtype))
      throw CatalogError(path + ": array '" + name + "' does not match its declared size");
    arr.bytes.assign(buf.begin() + static_cast<std::ptrdiff_t>(pos), buf.begin() + static_cast<std::ptrdiff_t>(pos + nbytes));
    pos += nbytes;
    file.arrays.emplace(std::move(name), std::move(arr));
  }
  if (!expected_fingerprint.empty() && file.fingerprint() != expected_fingerprint)
    throw CatalogError(path + ": catalog for topology " + file.fingerprint() + ", not " + expected_fingerprint +
                       ": rebuild it for this topology");
  return file;
}

}  // namespace variopath
