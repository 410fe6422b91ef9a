// Runs the Catch2 session of a test executable (catch_session.cpp holds Catch2's implementation,
// whose Session class catch.hpp declares only where the implementation is compiled).
#pragma once

int run_catch_session(int argc, char** argv);
