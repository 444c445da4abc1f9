// The synthetic corpus of `lockstep data synth`: text a small transformer learns quickly (word
// spellings, Zipfian word choice, a fixed sentence grammar, noun -> verb -> object preferences),
// so a training demo shows the loss falling well below the corpus's unigram entropy. Every draw
// comes from Philox in a fixed sequence, so the corpus is a pure function of (seed, tokens).
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "lockstep/data.h"

namespace lockstep::data {
namespace {
// Philox counter word 3 of every synth draw ("synt"): separates these draws from other streams
// keyed by the same seed. Bump kSynthVersion whenever the generated text may change.
constexpr uint32_t kSynthTag = 0x746e7973;
constexpr uint64_t kSynthVersion = 1;
constexpr uint64_t kProgressEvery = uint64_t{1} << 20;  // tokens

// Philox draws consumed in order: block b is Philox4x32({b lo, b hi, 0, kSynthTag}, key(seed)),
// its four words used one after another.
class DrawSequence {
 public:
  explicit DrawSequence(uint64_t seed) : key_(PhiloxKeyFromSeed(seed)) {}

  // Uniform in [0, n) by 64-bit multiply-shift, as in the stream's shuffle.
  uint64_t Below(uint64_t n) {
    const uint64_t low = Next();  // two statements: the order of a | b's operands is unspecified
    const uint64_t x = low | uint64_t{Next()} << 32;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
  }
  bool Chance(uint64_t numerator, uint64_t denominator) { return Below(denominator) < numerator; }

 private:
  uint32_t Next() {
    if (used_ == 4) {
      words_ = Philox4x32(
          {static_cast<uint32_t>(block_), static_cast<uint32_t>(block_ >> 32), 0, kSynthTag}, key_);
      ++block_;
      used_ = 0;
    }
    return words_[used_++];
  }

  PhiloxKey key_;
  uint64_t block_ = 0;
  PhiloxCounter words_{};
  int used_ = 4;
};

// A word class: words in rank order, drawn with Zipfian weights ~ 1 / (rank + 1) held as
// integers so that sampling involves no floating point at all.
class WordClass {
 public:
  void Add(std::string word) {
    cumulative_.push_back((cumulative_.empty() ? 0 : cumulative_.back()) +
                          (uint64_t{1} << 32) / (words_.size() + 1));
    words_.push_back(std::move(word));
  }
  size_t Draw(DrawSequence& draws) const {
    const uint64_t x = draws.Below(cumulative_.back());
    return std::upper_bound(cumulative_.begin(), cumulative_.end(), x) - cumulative_.begin();
  }
  const std::string& operator[](size_t rank) const { return words_[rank]; }
  size_t size() const { return words_.size(); }

 private:
  std::vector<std::string> words_;
  std::vector<uint64_t> cumulative_;
};

constexpr std::array<std::string_view, 22> kOnsets = {"b",  "d",  "f",  "g",  "k",  "l", "m",  "n",
                                                      "p",  "r",  "s",  "t",  "v",  "z", "ch", "sh",
                                                      "th", "br", "kr", "st", "pl", "gr"};
constexpr std::array<std::string_view, 8> kVowels = {"a", "e", "i", "o", "u", "ai", "ou", "ee"};
constexpr std::array<std::string_view, 8> kCodas = {"", "", "", "n", "r", "s", "l", "k"};
constexpr size_t kPreferences = 3;  // preferred verbs per noun, preferred objects per verb

struct Lexicon {
  WordClass determiners, prepositions, nouns, verbs, adjectives, adverbs;
  std::vector<std::array<size_t, kPreferences>> noun_verbs, verb_objects;
};

template <size_t N>
std::string_view Pick(DrawSequence& draws, const std::array<std::string_view, N>& options) {
  return options[draws.Below(N)];
}

Lexicon MakeLexicon(DrawSequence& draws) {
  Lexicon lex;
  std::set<std::string> taken;
  auto fill = [&](WordClass& words, size_t count, uint64_t min_syllables, uint64_t max_syllables) {
    while (words.size() < count) {
      std::string w;
      const uint64_t syllables = min_syllables + draws.Below(max_syllables - min_syllables + 1);
      for (uint64_t s = 0; s < syllables; ++s) {
        w += Pick(draws, kOnsets);
        w += Pick(draws, kVowels);
        w += Pick(draws, kCodas);
      }
      if (taken.insert(w).second) words.Add(std::move(w));
    }
  };
  fill(lex.determiners, 6, 1, 1);
  fill(lex.prepositions, 10, 1, 2);
  fill(lex.nouns, 180, 1, 3);
  fill(lex.verbs, 120, 1, 3);
  fill(lex.adjectives, 70, 2, 3);
  fill(lex.adverbs, 24, 2, 3);
  lex.noun_verbs.resize(lex.nouns.size());
  for (auto& verbs : lex.noun_verbs) {
    for (size_t& v : verbs) v = lex.verbs.Draw(draws);
  }
  lex.verb_objects.resize(lex.verbs.size());
  for (auto& objects : lex.verb_objects) {
    for (size_t& n : objects) n = lex.nouns.Draw(draws);
  }
  return lex;
}

// Appends "det [adj] noun" and returns the noun's rank; without `noun` it is drawn by frequency.
size_t AppendNounPhrase(const Lexicon& lex, DrawSequence& draws, std::string& text,
                        std::optional<size_t> noun) {
  text += lex.determiners[lex.determiners.Draw(draws)];
  text += ' ';
  if (draws.Chance(1, 3)) {
    text += lex.adjectives[lex.adjectives.Draw(draws)];
    text += ' ';
  }
  const size_t n = noun ? *noun : lex.nouns.Draw(draws);
  text += lex.nouns[n];
  return n;
}

// sentence := noun-phrase verb [noun-phrase] [preposition noun-phrase] [adverb] ("." | "!" | "?")
// The verb is one of the subject's preferred verbs 3 times in 4, the object one of the verb's
// preferred objects 3 times in 4: structure beyond word frequencies for a model to find.
void AppendSentence(const Lexicon& lex, DrawSequence& draws, std::string& text) {
  const size_t subject = AppendNounPhrase(lex, draws, text, std::nullopt);
  const size_t verb = draws.Chance(3, 4) ? lex.noun_verbs[subject][draws.Below(kPreferences)]
                                         : lex.verbs.Draw(draws);
  text += ' ';
  text += lex.verbs[verb];
  if (draws.Chance(2, 3)) {
    text += ' ';
    AppendNounPhrase(lex, draws, text,
                     draws.Chance(3, 4)
                         ? std::optional(lex.verb_objects[verb][draws.Below(kPreferences)])
                         : std::nullopt);
  }
  if (draws.Chance(1, 4)) {
    text += ' ';
    text += lex.prepositions[lex.prepositions.Draw(draws)];
    text += ' ';
    AppendNounPhrase(lex, draws, text, std::nullopt);
  }
  if (draws.Chance(1, 5)) {
    text += ' ';
    text += lex.adverbs[lex.adverbs.Draw(draws)];
  }
  const uint64_t end = draws.Below(10);
  text += end < 8 ? '.' : end == 8 ? '!' : '?';
}

}  // namespace

void WriteSynthCorpus(const std::filesystem::path& out, uint64_t seed, uint64_t tokens,
                      const Progress& progress, uint64_t max_shard_tokens) {
  if (tokens == 0) Fail("data synth: --tokens must be at least 1");
  // One byte per token in the .bin files (the .idx and manifest are small beside them).
  RequireFreeSpace(out, tokens, "data synth");
  ShardWriter writer(out, max_shard_tokens);
  DrawSequence draws(seed);
  const Lexicon lex = MakeLexicon(draws);
  std::string text;
  uint64_t next_report = kProgressEvery;
  while (writer.tokens_written() < tokens) {
    // A document is 4 to 16 sentences; the last one is cut so the total is exactly `tokens`.
    text.clear();
    const uint64_t sentences = 4 + draws.Below(13);
    for (uint64_t s = 0; s < sentences; ++s) {
      if (s > 0) text += ' ';
      AppendSentence(lex, draws, text);
    }
    text.resize(std::min<uint64_t>(text.size(), tokens - writer.tokens_written()));
    const auto bytes = std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    writer.AddDocument(TokenizeBytes(bytes));
    if (progress && writer.tokens_written() >= next_report) {
      progress(writer.tokens_written(), tokens);
      next_report = writer.tokens_written() + kProgressEvery;
    }
  }
  writer.Finish({{"generator", "lockstep data synth"},
                 {"generator_version", kSynthVersion},
                 {"seed", seed},
                 {"tokens", tokens}});
  if (progress) progress(tokens, tokens);
}

}  // namespace lockstep::data
