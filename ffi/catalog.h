// Catalog files (variopath_jax/catalog/store.py): a versioned container of plain arrays.
// The C++ core reads them with this loader; every failure throws CatalogError with a message
// naming the file and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace variopath {

struct CatalogError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One array of the container, kept as raw little-endian bytes plus its dtype and shape.
struct RawArray {
  uint8_t dtype = 0;  // 1 i16, 2 i32, 3 i64, 4 f64, 5 u8
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;

  size_t size() const;
  template <typename T>
  std::vector<T> as() const;
};

struct CatalogFile {
  uint16_t version = 0;
  std::map<std::string, RawArray> arrays;

  const RawArray& at(const std::string& name) const;
  std::string fingerprint() const;
};

constexpr uint16_t kCatalogVersion = 1;

// Read a catalog file; if expected_fingerprint is not empty, refuse a catalog of another topology.
CatalogFile load_catalog_file(const std::string& path, const std::string& expected_fingerprint);

// The same from bytes already in memory (``source`` names them in messages).
CatalogFile load_catalog_bytes(const std::vector<uint8_t>& buf, const std::string& source,
                               const std::string& expected_fingerprint);

uint32_t crc32(const uint8_t* data, size_t n);

}  // namespace variopath
