// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

/// @notice Test-only account that, when it receives ETH, calls back into a target once with
///         prepared calldata (e.g. the escrow's `withdraw` or `refund`, the registry's `withdraw`)
///         and records whether that re-entry succeeded. It can also act as a coordinator or a
///         provider by forwarding calls with `exec`.
contract ReentrantAttacker {
    address public target;
    bytes public payload;
    bool public armed;
    uint256 public attempts;
    uint256 public successes;
    uint256 public received;


    function arm(address target_, bytes calldata payload_) external {
        target = target_;
        payload = payload_;
        armed = true;
    }

    function exec(address to, bytes calldata data) external payable {
        (bool ok, bytes memory ret) = to.call{value: msg.value}(data);
        if (!ok) {
            // Bubble the target's revert data so the SDK decodes the real reason.
            assembly {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    receive() external payable {
        received += msg.value;
        if (armed) {
            armed = false;
            attempts += 1;
            (bool ok,) = target.call(payload);
            if (ok) successes += 1;
        }
    }

    /// @dev EIP-1271: this test wallet consents to every slot it is offered.
    function isValidSignature(bytes32, bytes calldata) external pure returns (bytes4) {
        return 0x1626ba7e;
    }
}
