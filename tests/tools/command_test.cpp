// The command registry of the command line (tools/cli/command.h): commands of several words are
// added under their parent whatever the registration order, siblings alphabetically; a missing
// parent, a path given twice and an empty path are errors that name the command.
#include "tools/cli/command.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn {
namespace {

using tools::add_commands;
using tools::CommandRegistration;

void add_alpha(CLI::App& parent) { parent.add_subcommand("alpha", "a"); }
void add_beta(CLI::App& parent) { parent.add_subcommand("beta", "b"); }
void add_gamma(CLI::App& parent) { parent.add_subcommand("gamma", "g"); }

std::vector<std::string> names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::App* sub : app.get_subcommands({})) out.push_back(sub->get_name());
  return out;
}

TEST(CommandRegistry, ChildrenUnderTheirParentSiblingsInOrder) {
  CLI::App app;
  // Registration order: a child before its parent, siblings out of order.
  add_commands(app, {{"beta gamma", add_gamma},
                     {"beta", add_beta},
                     {"alpha", add_alpha},
                     {"beta  alpha", add_alpha},
                     {"alpha beta", add_beta}});
  EXPECT_EQ(names(app), (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_EQ(names(*app.get_subcommand("alpha")), (std::vector<std::string>{"beta"}));
  EXPECT_EQ(names(*app.get_subcommand("beta")), (std::vector<std::string>{"alpha", "gamma"}));
}

void expect_error(const std::vector<CommandRegistration>& commands, const std::string& words) {
  CLI::App app;
  try {
    add_commands(app, commands);
    FAIL() << "no error for " << words;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

TEST(CommandRegistry, ErrorsNameTheCommand) {
  expect_error({{"alpha", add_alpha}, {"beta gamma", add_gamma}},
               "the command 'beta gamma' needs the command 'beta', which is not registered");
  expect_error({{"alpha", add_alpha}, {"beta", add_beta}, {"alpha", add_alpha}},
               "the command 'alpha' is registered twice");
  expect_error({{"  ", add_alpha}}, "empty path");
  expect_error({{"alpha", nullptr}}, "no function");
}

}  // namespace
}  // namespace pagedattn
