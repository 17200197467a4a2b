// Helpers for the job report's tests: the charts of a rendered page.
#ifndef TANDEM_TESTS_UNIT_COORDINATOR_REPORT_REPORT_TEST_UTIL_H_
#define TANDEM_TESTS_UNIT_COORDINATOR_REPORT_REPORT_TEST_UTIL_H_

#include <map>
#include <string>

namespace tandem {

// Each <svg class="chart"> of `html` by its data-chart name, with the number
// of data marks in it (elements of class "data").
inline std::map<std::string, int> ChartDataMarks(const std::string& html) {
  std::map<std::string, int> out;
  const std::string open = "<svg class=\"chart\" data-chart=\"";
  for (size_t at = html.find(open); at != std::string::npos;
       at = html.find(open, at + 1)) {
    const size_t name_end = html.find('"', at + open.size());
    const size_t end = html.find("</svg>", at);
    const std::string name =
        html.substr(at + open.size(), name_end - at - open.size());
    const std::string svg = html.substr(at, end - at);
    int marks = 0;
    for (size_t m = svg.find("class=\"data\""); m != std::string::npos;
         m = svg.find("class=\"data\"", m + 1)) {
      ++marks;
    }
    out[name] = marks;
  }
  return out;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_UNIT_COORDINATOR_REPORT_REPORT_TEST_UTIL_H_
