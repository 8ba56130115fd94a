// Compile the Solidity sources with the pinned solc (standard JSON) and write
// deterministic artifacts for the Python package.
//
//   node contracts/build.mjs [--out-root DIR]
//
// Artifacts land under DIR (default: the repository root):
//   aitbc_agent_sdk/chain/artifacts/{TrainingEscrow,ProviderRegistry}.json  (shipped in the wheel)
//   tests/artifacts/{RevertingReceiver,TestToken,ReentrantAttacker}.json     (test-only, never shipped)
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import solc from "solc";

const CONTRACTS_DIR = dirname(fileURLToPath(import.meta.url));
const REPO_ROOT = resolve(CONTRACTS_DIR, "..");

// Cancun runs on py-evm's default fork (Prague) in eth-tester and on anvil.
const SETTINGS = {
  optimizer: { enabled: true, runs: 200 },
  evmVersion: "cancun",
};

// source unit name (relative to contracts/) -> contract -> artifact path (relative to out root)
const TARGETS = [
  {
    source: "TrainingEscrow.sol",
    contract: "TrainingEscrow",
    out: "aitbc_agent_sdk/chain/artifacts/TrainingEscrow.json",
  },
  {
    source: "ProviderRegistry.sol",
    contract: "ProviderRegistry",
    out: "aitbc_agent_sdk/chain/artifacts/ProviderRegistry.json",
  },
  {
    source: "test/RevertingReceiver.sol",
    contract: "RevertingReceiver",
    out: "tests/artifacts/RevertingReceiver.json",
  },
  {
    source: "test/TestToken.sol",
    contract: "TestToken",
    out: "tests/artifacts/TestToken.json",
  },
  {
    source: "test/ReentrantAttacker.sol",
    contract: "ReentrantAttacker",
    out: "tests/artifacts/ReentrantAttacker.json",
  },
];

function parseArgs(argv) {
  let outRoot = REPO_ROOT;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--out-root" && i + 1 < argv.length) {
      outRoot = resolve(argv[++i]);
    } else {
      throw new Error(`unknown argument: ${argv[i]}`);
    }
  }
  return { outRoot };
}

function main() {
  const { outRoot } = parseArgs(process.argv.slice(2));

  const sources = {};
  const rawSources = {};
  for (const { source } of TARGETS) {
    const content = readFileSync(join(CONTRACTS_DIR, source), "utf8");
    sources[source] = { content };
    rawSources[source] = content;
  }

  const input = {
    language: "Solidity",
    sources,
    settings: {
      ...SETTINGS,
      outputSelection: {
        "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] },
      },
    },
  };

  const output = JSON.parse(solc.compile(JSON.stringify(input)));
  const problems = output.errors ?? [];
  for (const p of problems) {
    console.error(p.formattedMessage ?? p.message);
  }
  if (problems.some((p) => p.severity === "error")) {
    process.exit(1);
  }

  for (const { source, contract, out } of TARGETS) {
    const compiled = output.contracts?.[source]?.[contract];
    if (!compiled) {
      throw new Error(`solc produced no output for ${source}:${contract}`);
    }
    // Key order is fixed here, so the file is byte-identical across rebuilds.
    const artifact = {
      contractName: contract,
      abi: compiled.abi,
      bytecode: "0x" + compiled.evm.bytecode.object,
      deployedBytecode: "0x" + compiled.evm.deployedBytecode.object,
      compiler: { version: solc.version(), settings: SETTINGS },
      sourceSha256: createHash("sha256").update(rawSources[source], "utf8").digest("hex"),
    };
    const path = join(outRoot, out);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, JSON.stringify(artifact, null, 2) + "\n");
    console.log(`wrote ${path}`);
  }
}

main();
