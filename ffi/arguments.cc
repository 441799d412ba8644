#include "arguments.h"

#include <string>

namespace ffi = xla::ffi;

namespace variopath {

int64_t rows_of(const ffi::AnyBuffer& buf) { return buf.dimensions().size() ? buf.dimensions()[0] : 0; }

int64_t row_bytes_of(const ffi::AnyBuffer& buf) {
  const int64_t rows = rows_of(buf);
  return rows ? static_cast<int64_t>(buf.size_bytes()) / rows : 0;
}

namespace {

// What every contribution carries about its rank, rows and buffers.
Contribution base(const ffi::AnyBuffer& in, ffi::AnyBuffer& out, int32_t rank, int64_t config, int64_t axis_size) {
  Contribution c;
  c.rank = rank;
  c.config = config;
  c.axis_size = axis_size;
  c.dtype = static_cast<int64_t>(in.element_type());
  c.row_bytes = row_bytes_of(in);
  c.input = static_cast<const uint8_t*>(in.untyped_data());
  c.input_rows = rows_of(in);
  c.output = static_cast<uint8_t*>(out.untyped_data());
  c.output_rows = rows_of(out);
  return c;
}

}  // namespace

Contribution all_to_all_v_contribution(const ffi::AnyBuffer& x, const int32_t* send_counts, size_t counts,
                                       int32_t rank, ffi::AnyBuffer& y, int32_t* recv_counts, int64_t config,
                                       int64_t axis_size) {
  Contribution c = base(x, y, rank, config, axis_size);
  c.recv_counts = recv_counts;
  if (x.dimensions().size() == 0) c.error = "x must have a leading row axis";
  if (counts != static_cast<size_t>(axis_size))
    c.error = "send_counts has " + std::to_string(counts) + " entries for a mesh axis of " +
              std::to_string(axis_size) + " devices";
  if (c.output_rows && row_bytes_of(y) != c.row_bytes && c.input_rows) c.error = "x and y rows differ in size";
  int64_t offset = 0;
  for (int64_t j = 0; c.error.empty() && j < axis_size; ++j) {
    const int64_t rows = send_counts[j];
    if (rows < 0) {
      c.error = "send_counts[" + std::to_string(j) + "] = " + std::to_string(rows) + " is negative";
      break;
    }
    c.slices.push_back({static_cast<int32_t>(j), offset, rows, -1});
    offset += rows;
  }
  if (c.error.empty() && offset > c.input_rows)
    c.error = "send_counts sum to " + std::to_string(offset) + " rows but x has " + std::to_string(c.input_rows);
  return c;
}

Contribution ragged_contribution(const ffi::AnyBuffer& operand, const ffi::AnyBuffer& output,
                                 const RaggedSlices& slices, int32_t rank, ffi::AnyBuffer& result,
                                 int32_t* recv_offsets, int32_t* source_offsets, int64_t config, int64_t axis_size) {
  Contribution c = base(operand, result, rank, config, axis_size);
  c.ragged = true;
  c.recv_offsets = recv_offsets;
  c.source_offsets = source_offsets;
  const size_t k = slices.lengths[1];
  if (slices.lengths[0] != k || slices.lengths[2] != k || slices.lengths[3] != k)
    c.error = "input_offsets, send_sizes, output_offsets and recv_sizes must have the same length";
  else if (axis_size <= 0 || k % static_cast<size_t>(axis_size) != 0)
    c.error = "the number of slices (" + std::to_string(k) + ") is not a multiple of the mesh axis size (" +
              std::to_string(axis_size) + ")";
  else if (c.row_bytes != row_bytes_of(output) && c.input_rows && rows_of(output))
    c.error = "operand and output rows differ in size";
  const size_t per = axis_size > 0 ? k / static_cast<size_t>(axis_size) : 1;
  for (size_t s = 0; c.error.empty() && s < k; ++s) {
    const int64_t in = slices.input_offsets[s], rows = slices.send_sizes[s];
    const int64_t out = slices.output_offsets[s], expect = slices.recv_sizes[s];
    if (rows < 0 || expect < 0 || in < 0 || out < 0)
      c.error = "slice " + std::to_string(s) + " has a negative offset or size";
    else if (in + rows > c.input_rows)
      c.error = "slice " + std::to_string(s) + " reads rows [" + std::to_string(in) + ", " + std::to_string(in + rows) +
                ") of an operand with " + std::to_string(c.input_rows) + " rows";
    else
      c.slices.push_back({static_cast<int32_t>(s / per), in, rows, out});
    c.recv_sizes.push_back(expect);
  }
  return c;
}

}  // namespace variopath
